package memlock_test

import (
	"testing"

	"github.com/fencekit/fence/memlock"
)

// DESIGN.md's token contract asks every acquisition of a name for a token
// greater than every token issued before it, also when the counter is lost.
// memlock's counter lives in the Locker and starts at 1, so a new Locker (a
// restarted program) issues 1, 2, … again. Decided: kept and documented
// (memlock is for examples, documentation and tests, which print and
// compare small tokens; clock-based tokens as redislock's would hide that a
// process-local lock is no lock across restarts). The test pins it, so that
// a change of it is a decision, not an accident.
func TestTokensCountFromOnePerLocker(t *testing.T) {
	before, _ := memlock.New(nil)
	var last int64
	for range 3 {
		lease, err := before.Acquire(t.Context(), "lock:payment:1001")
		if err != nil {
			t.Fatal(err)
		}
		last = int64(lease.Token())
		_ = lease.Release(t.Context())
	}
	after, _ := memlock.New(nil) // the process restarted
	lease, err := after.Acquire(t.Context(), "lock:payment:1001")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(t.Context())
	if last != 3 || lease.Token() != 1 {
		t.Fatalf("tokens: the third of the first Locker %d, the first of a new one %d; want 3 and 1 (documented)", last, lease.Token())
	}
}
