package redislock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

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
		{fmt.Errorf("redislock: %w", net.ErrClosed), true}, // ci58: a Ring's shard replaced under a try
		{fence.ErrNotReplicated, true},
		{ErrBadTokenRecord, false},
	} {
		if got := transient(c.err); got != c.want {
			t.Errorf("transient(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// passedDeadline is a context whose deadline has passed but whose timer
// has not ended it yet: the moment a read with ContextTimeoutEnabled times
// out at that deadline, on a loaded machine, before ctx.Err() says so.
type passedDeadline struct{ context.Context }

func (passedDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// A socket timeout at ctx's deadline is reported as ctx's deadline even
// when ctx's own timer has not fired yet (CI's TestHungRedisReturnsByDeadline
// saw Extend return a bare i/o timeout under load).
func TestDirectErrDeadlinePassed(t *testing.T) {
	var cs callers
	timeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	err := cs.directErr(passedDeadline{context.Background()}, timeout)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("directErr = %v, want an error matching context.DeadlineExceeded", err)
	}
	if err := cs.directErr(context.Background(), timeout); errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("directErr without a deadline = %v, want the socket's timeout only", err)
	}
}
