package tlsanswer_test

import (
	"testing"

	"github.com/fencekit/fence/internal/testmain"
)

func TestMain(m *testing.M) { testmain.Run(m, nil) }
