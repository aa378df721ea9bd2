package queue_test

import (
	"testing"

	"github.com/fencekit/fence/internal/pgtest"
	"github.com/fencekit/fence/internal/testmain"
)

var pg *pgtest.Server

func TestMain(m *testing.M) {
	testmain.Run(m, func() (func(), error) {
		var err error
		pg, err = pgtest.Launch()
		if err != nil {
			return nil, err
		}
		return pg.Kill, nil
	})
}
