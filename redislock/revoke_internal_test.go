package redislock

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// failedReleases fails, while armed, every release-script call (by SHA,
// or by source after NOSCRIPT) without sending it, as a connection that
// cannot be made would, and tells failed about each.
type failedReleases struct {
	armed  atomic.Bool
	n      atomic.Int64
	failed chan struct{}
}

func (f *failedReleases) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *failedReleases) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if f.armed.Load() && strings.HasPrefix(cmd.Name(), "eval") {
			for _, a := range cmd.Args() {
				if s, ok := a.(string); ok && (s == releaseScript.Hash() || s == releaseSrc) {
					f.n.Add(1)
					select {
					case f.failed <- struct{}{}:
					default:
					}
					err := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("test: no connection")}
					cmd.SetErr(err)
					return err
				}
			}
		}
		return next(ctx, cmd)
	}
}
func (f *failedReleases) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestRevocationOutlastsAPause: an acquisition whose reply is lost on a
// paused server is revoked, but the revocation may not reach the server
// either while it is paused (a fresh connection's handshake times out, the
// pool is exhausted, go-redis's own retries run out); here a hook fails it
// without sending it. Giving up after that one try left the acquisition
// sitting in the server's socket unrevoked: when the server resumed it
// took the lock, for a full lease that nobody holds. The revocation must
// be retried until the server answers (within the lease time).
func TestRevocationOutlastsAPause(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const name = "lock:payment:1001"
	// A short read timeout: the acquisition's reply is lost well within
	// the pause.
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	l, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	hook := &failedReleases{failed: make(chan struct{}, 1)}
	c.AddHook(hook)
	// Loads the scripts and caches the replica counts, so that the next
	// acquisition sends its script at once.
	lease, err := l.Acquire(ctx, name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}

	hook.armed.Store(true)
	resume := srv.Pause(t)
	actx, acancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = l.Acquire(actx, name, fence.TTL(time.Minute))
	acancel()
	if err == nil {
		t.Fatal("Acquire on a paused server succeeded")
	}
	select { // the revocation was tried, and failed, while the server is paused
	case <-hook.failed:
	case <-ctx.Done():
		t.Fatal("no revocation was tried")
	}
	hook.armed.Store(false)
	resume()

	admin := srv.Client(t)
	eventually(t, func() bool { return admin.Exists(ctx, l.keys(name).lock).Val() == 0 })
	t.Logf("%d failed revocation tries", hook.n.Load())
}

// sentHook tells sent when a script call on key starts.
type sentHook struct {
	key  string
	sent chan struct{}
}

func (h *sentHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *sentHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.HasPrefix(cmd.Name(), "eval") {
			for _, a := range cmd.Args() {
				if s, ok := a.(string); ok && s == h.key {
					select {
					case h.sent <- struct{}{}:
					default:
					}
				}
			}
		}
		return next(ctx, cmd)
	}
}
func (h *sentHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestCancelledAcquisitionRevoked: an Acquire cancelled (not timed out)
// while its script sits in a paused server's socket returns at once; the
// late reply (here the client's own read timeout) must revoke the
// acquisition, so that it does not take the lock when the server resumes.
// A cancellation is not a transient error, so only the give-up's callback
// covers this case.
func TestCancelledAcquisitionRevoked(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const name = "lock:payment:1001"
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	l, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctx, name, fence.TTL(time.Minute)) // loads the scripts, caches the counts
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	hook := &sentHook{key: l.keys(name).lock, sent: make(chan struct{}, 1)}
	c.AddHook(hook)

	resume := srv.Pause(t)
	actx, acancel := context.WithCancel(ctx)
	go func() {
		<-hook.sent
		acancel()
	}()
	if _, err := l.Acquire(actx, name, fence.TTL(time.Minute)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire = %v, want context.Canceled", err)
	}
	// The revocation, sent after the client's read timeout, runs after the
	// acquisition on the resumed server, or before it.
	resume()
	admin := srv.Client(t)
	eventually(t, func() bool {
		return admin.Exists(ctx, l.keys(name).lock).Val() == 0 &&
			len(admin.Keys(ctx, l.keys(name).lock+":revoked:*").Val()) == 1
	})
}
