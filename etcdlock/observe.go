package etcdlock

import (
	"log/slog"
	"time"

	"github.com/fencekit/fence"
)

// backend is the Backend of the events this package reports.
const backend = "etcd"

// ended reports the end of ls, once: the log line first, then the event.
func (ls *Lease) ended(cause fence.LeaseCause, why error) {
	if l := ls.l; l.log != nil || l.obs != nil {
		fence.ReportLeaseEnded(ls.ctx, l.obs, l.log, "etcdlock", fence.LeaseEvent{Backend: backend,
			Name: ls.name, Token: ls.token, Cause: cause, Held: time.Since(ls.acquired), Err: why})
	}
}

// renewFailed logs a watchdog renewal that failed without losing the
// lease; the watchdog tries again sooner.
func (ls *Lease) renewFailed(err error) {
	if l := ls.l; l.log != nil && ls.errNow() == nil {
		l.log.LogAttrs(ls.ctx, slog.LevelWarn, "etcdlock: renewal failed",
			slog.String("name", ls.name), slog.Int64("token", int64(ls.token)),
			slog.Time("deadline", ls.Deadline()), slog.Any("error", err))
	}
}
