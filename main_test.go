package fence_test

import (
	"testing"

	"github.com/fencekit/fence/internal/testmain"
)

// exampleAddr is a redis-server for the examples, which get no *testing.T.
var exampleAddr string

func TestMain(m *testing.M) { testmain.Run(m, testmain.Redis(&exampleAddr)) }
