package fencerueidis_test

import (
	"testing"

	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/rueidis"
)

// TestSubscriptionKilledRESP2NoClientInfo: TestSubscriptionKilled's RESP2
// attack by a user whose ACL denies CLIENT (a common hardening: no CLIENT
// KILL, no CLIENT LIST), so that Subscribe cannot ask the protocol with
// CLIENT INFO. The waiter must still be woken after its subscription's
// connection is killed and the lock released.
func TestSubscriptionKilledRESP2NoClientInfo(t *testing.T) {
	srv := redistest.Start(t)
	if err := srv.Client(t).Do(ctx(t), "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-client").Err(); err != nil {
		t.Fatal(err)
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, Username: "app", Password: "pw",
		AlwaysRESP2: true, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	subscriptionKilled(t, srv, newLocker(t, c, redislock.Options{}))
}
