package fencerueidis

import (
	"testing"

	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/rueidis"
)

// TestStopFlagFound pins what stopFlag reads in the rueidis version this
// module requires: the closed flag of a single and of a Sentinel client,
// clear while the client is open and set by its Close. A rueidis upgrade
// that renames or retypes it fails here, not silently in the parking.
func TestStopFlagFound(t *testing.T) {
	primary := redistest.Start(t)
	sentinels := redistest.StartSentinels(t, primary, 1)
	for what, o := range map[string]rueidis.ClientOption{
		"single":   {InitAddress: []string{primary.Addr}},
		"sentinel": {InitAddress: sentinels.Addrs(), Sentinel: rueidis.SentinelOption{MasterSet: sentinels.Master}},
	} {
		c, err := rueidis.NewClient(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		cn := conn{c: c, stop: stopFlag(c)}
		if cn.stop == nil {
			t.Fatalf("%s client %T: no closed flag found", what, c)
		}
		if cn.closed() {
			t.Fatalf("%s client: closed before Close", what)
		}
		c.Close()
		if !cn.closed() {
			t.Fatalf("%s client: not closed after Close", what)
		}
	}
	if stopFlag(nil) != nil {
		t.Fatal("stopFlag(nil) found a flag")
	}
}
