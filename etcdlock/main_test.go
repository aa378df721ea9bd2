package etcdlock_test

import (
	"testing"

	"github.com/fencekit/fence/internal/etcdserver"
	"github.com/fencekit/fence/internal/testmain"
)

// shared is a standalone etcd server for the examples and the tests that
// need no cluster of their own; its endpoint is exampleEndpoint.
var (
	shared          *etcdserver.Cluster
	exampleEndpoint string
)

func TestMain(m *testing.M) {
	testmain.Run(m, func() (func(), error) {
		c, err := etcdserver.Start("")
		if err != nil {
			return nil, err
		}
		shared, exampleEndpoint = c, c.Members[0].ClientURL
		return c.Close, nil
	})
}
