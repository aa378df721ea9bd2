package zklock

import (
	"log/slog"
	"time"

	"github.com/fencekit/fence"
)

// backend is the Backend of the events this package reports.
const backend = "zookeeper"

// ended reports the end of ls, once: the log line first, then the event.
func (ls *lease) ended(cause fence.LeaseCause, why error) {
	if l := ls.l; l.log != nil || l.obs != nil {
		fence.ReportLeaseEnded(ls.ctx, l.obs, l.log, "zklock", fence.LeaseEvent{Backend: backend,
			Name: ls.a.name, Token: ls.token, Cause: cause, Held: time.Since(ls.granted), Err: why})
	}
}

// checkFailed logs a check of the lease's node that failed without losing
// the lease (the connection lost, not yet the session); the monitor tries
// again sooner, and the lease ends at its deadline if none succeeds.
func (ls *lease) checkFailed(err error) {
	if l := ls.l; l.log != nil && ls.errNow() == nil {
		l.log.LogAttrs(ls.ctx, slog.LevelWarn, "zklock: check of the lease's node failed",
			slog.String("name", ls.a.name), slog.Int64("token", int64(ls.token)),
			slog.Time("deadline", ls.Deadline()), slog.Any("error", err))
	}
}
