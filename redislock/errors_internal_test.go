package redislock

import (
	"context"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/fencekit/fence"
	"github.com/redis/go-redis/v9"
)

// TestTransientClassifies pins which errors a wait rides out and which end
// it at once. The caller's own deadline is permanent although
// context.DeadlineExceeded is a net.Error with Timeout true; a socket
// timeout is transient. (Redis's own error replies are classified against
// a real server in the wait tests.)
func TestTransientClassifies(t *testing.T) {
	socketTimeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{context.DeadlineExceeded, false},
		{fmt.Errorf("acquire: %w", context.DeadlineExceeded), false},
		{context.Canceled, false},
		{socketTimeout, true},
		{fmt.Errorf("eval: %w", socketTimeout), true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{redis.ErrClosed, false},
		{fence.ErrNotReplicated, true},
		{ErrBadTokenRecord, false},
	} {
		if got := transient(c.err); got != c.want {
			t.Errorf("transient(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
