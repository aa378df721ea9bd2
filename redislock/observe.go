package redislock

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/fencekit/fence"
)

// backend is the Backend of the events this package reports.
const backend = "redis"

// leaseEnded reports the end of ls, once: the log line first, then the
// event.
func (l *Locker) leaseEnded(ls *lease, cause fence.LeaseCause, why error) {
	if l.log == nil && l.obs == nil {
		return
	}
	fence.ReportLeaseEnded(ls.parent, l.obs, l.log, "redislock", fence.LeaseEvent{Backend: backend,
		Name: ls.attempt.name, Token: ls.token, Cause: cause, Held: time.Since(ls.granted), Err: why})
}

// renewFailed logs a watchdog renewal that failed without losing the lease;
// the watchdog tries again sooner.
func (l *Locker) renewFailed(ls *lease, err error) {
	// A renewal cut short by Release is no failure; one that ran into the
	// deadline (the lease is lost meanwhile) is.
	// ls.err, not Err, which may end the lease and report it here, on
	// the watchdog's goroutine, whose end Release waits for.
	ls.mu.Lock()
	ended := ls.err
	ls.mu.Unlock()
	if l.log != nil && !errors.Is(ended, fence.ErrReleased) {
		l.log.LogAttrs(ls.parent, slog.LevelWarn, "redislock: renewal failed",
			slog.String("name", ls.attempt.name), slog.Int64("token", int64(ls.token)),
			slog.Time("deadline", ls.Deadline()), slog.Any("error", err))
	}
}

// syncRefused reports an acquisition (token 0) or a renewal that too few
// replicas acknowledged.
func (l *Locker) syncRefused(ctx context.Context, name string, token fence.Token, renewal bool, acked, required int) {
	if l.obs != nil {
		l.obs.ReplicaSyncRefused(fence.ReplicaSyncEvent{Backend: backend, Name: name, Renewal: renewal, Acked: acked, Required: required})
	}
	if l.log != nil {
		attrs := []slog.Attr{slog.String("name", name), slog.Int("acked", acked), slog.Int("required", required)}
		op := "acquisition"
		if renewal {
			op = "renewal"
			attrs = append(attrs, slog.Int64("token", int64(token)))
		}
		l.log.LogAttrs(ctx, slog.LevelWarn, "redislock: too few replicas acknowledged the "+op, attrs...)
	}
}
