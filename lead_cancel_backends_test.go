package fence_test

import (
	"testing"
	"time"

	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/internal/stresstest"
	"github.com/fencekit/fence/redislock"
)

// Leads on a real Redis, their ctx cancelled at random moments (see
// stresstest.LeadCancels): the lease time is 30 s, so a lock that a
// cancelled campaign or term left behind would show.
func TestLeadRedisCancelledAtRandom(t *testing.T) {
	srv := redistest.Start(t)
	a, err := redislock.New(srv.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := redislock.New(srv.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	stresstest.LeadCancels(t, 60, a, b, 2*time.Second, 5*time.Second)
}
