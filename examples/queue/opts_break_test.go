package queue_test

import (
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
)

// TestRunUserOnElectedKeepsElectedLog: Run's opts are passed to Lead, and
// a caller's fence.OnElected (a metric of its own, say) replaced the one
// that Run set to log each term's start (LogElected, "elected", with the
// token): the terms then began with nothing logged, though the log's other
// records (claimed, applied, term ended) name tokens that only it
// introduced. Both must run.
func TestRunUserOnElectedKeepsElectedLog(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	logs := &counter{}
	var mine atomic.Int32
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		Block: 50 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c, fence.OnElected(func(fence.Lease) { mine.Add(1) }))
	if _, err := queue.Produce(ctx, rdb, "s", "a", 1); err != nil {
		t.Fatal(err)
	}
	until(t, 10*time.Second, "the message applied", func() (bool, error) {
		return logs.get(queue.LogApplied) == 1, nil
	})
	if mine.Load() == 0 || logs.get(queue.LogElected) == 0 {
		t.Fatalf("the caller's OnElected called %d times, %d %q logged; want both at least once", mine.Load(), logs.get(queue.LogElected), queue.LogElected)
	}
}
