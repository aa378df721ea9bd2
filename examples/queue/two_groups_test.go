package queue_test

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
)

// TestTwoGroupsOfOneStream: two consumer groups read one stream into one
// database (a deployment whose group was renamed while the old one still
// ran, or a second -group by mistake). Each message is applied once (the
// tables are keyed by stream and id), but both groups fence the message's
// guard resource, Resource(stream, id), which names no group, with the
// tokens of two locks (LockName names the group): the leader whose token
// is the smaller is refused wherever the other applied first, logs
// "rejected" (a newer leader), and ends its term, its lease given up. Seen
// with 200 messages produced while both led: g1 4 elections, 3 rejected;
// g2 3 elections, 2 rejected; each message applied once. The terms go on
// changing hands for as long as both groups run. Decided: that is safe,
// and it is a misconfiguration (the tables would need the group in their
// keys for two groups to mean two effects), so each consumer says so once,
// at ERROR, naming the other groups (LogOtherGroups). Naming the group in
// Resource would change its format (old and new consumers fencing apart
// during an upgrade); one lock per stream would change LockName's, with
// the same upgrade hazard.
func TestTwoGroupsOfOneStream(t *testing.T) {
	const n = 200
	ctx, rdb, db := servers(t, 60*time.Second)
	logs := map[string]*counter{}
	for _, g := range []string{"g1", "g2"} {
		logs[g] = &counter{}
		c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: g, Name: "c-" + g,
			MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs[g])}
		running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
		until(t, 10*time.Second, g+" elected", func() (bool, error) { return logs[g].get(queue.LogElected) == 1, nil })
	}
	// Both leaders wait for new entries, and race for each.
	var want int64
	for i := 1; i <= n; i++ {
		if _, err := queue.Produce(ctx, rdb, "s", "a", int64(i)); err != nil {
			t.Fatal(err)
		}
		want += int64(i)
	}
	var state string
	until(t, 30*time.Second, "both groups done", func() (bool, error) {
		state = ""
		for _, g := range []string{"g1", "g2"} {
			l := logs[g]
			state += fmt.Sprintf("%s: %d elected, %d applied, %d duplicate, %d rejected; ", g, l.get(queue.LogElected),
				l.get(queue.LogApplied), l.get(queue.LogDuplicate), l.get(queue.LogRejected))
			if l.get(queue.LogApplied)+l.get(queue.LogDuplicate) < n {
				return false, nil
			}
			if p, err := pending(ctx, rdb, "s", g); err != nil || p != 0 {
				return false, err
			}
		}
		return true, nil
	}, &state)
	if sum, err := count(ctx, db, `SELECT balance FROM queue_balance WHERE account = 'a'`); err != nil || sum != want {
		t.Fatalf("balance %d (%v), want %d", sum, err, want)
	}
	// The refusals are the price of the misconfiguration: a consumer
	// whose writes the other group refused names it, once, at its next
	// term (the one that started first saw no other group at its first).
	told := func(g string) int { return logs[g].get(queue.LogOtherGroups) }
	until(t, 10*time.Second, "each refused group told of the other", func() (bool, error) {
		for _, g := range []string{"g1", "g2"} {
			if logs[g].get(queue.LogRejected) > 0 && told(g) == 0 {
				return false, nil
			}
		}
		return told("g1")+told("g2") > 0, nil
	}, &state)
	for g, other := range map[string]string{"g1": "g2", "g2": "g1"} {
		if n := told(g); n > 1 {
			t.Fatalf("%s logged %q %d times, want at most once: %s", g, queue.LogOtherGroups, n, state)
		}
		if got := logs[g].attr(queue.LogOtherGroups, "others"); told(g) == 1 && got != "["+other+"]" {
			t.Fatalf("%s named the other groups %q, want [%s]", g, got, other)
		}
	}
	t.Logf("%s; told: g1 %d, g2 %d", state, told("g1"), told("g2"))
}
