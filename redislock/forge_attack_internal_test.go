package redislock

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// replyStall, once armed, holds the reply of the next script call on key
// until open is closed: the script has run on the server, and its reply
// is late to reach the caller (a slow network, a descheduled process).
type replyStall struct {
	key    string
	mu     sync.Mutex
	armed  bool
	open   chan struct{}
	passed int // replies of script calls on key that came back through the hook
}

func (h *replyStall) arm() { h.mu.Lock(); h.armed = true; h.mu.Unlock() }

// replies returns how many replies of script calls on key have come back.
func (h *replyStall) replies() int { h.mu.Lock(); defer h.mu.Unlock(); return h.passed }

func (h *replyStall) hit(cmds []redis.Cmder) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.armed {
		if onKey(cmds, h.key) {
			h.passed++
		}
		return false
	}
	if onKey(cmds, h.key) {
		h.armed = false
		return true
	}
	return false
}

// onKey reports whether cmds hold a script call on key.
func onKey(cmds []redis.Cmder, key string) bool {
	for _, c := range cmds {
		args := c.Args()
		if len(args) < 4 || !strings.HasPrefix(strings.ToLower(fmt.Sprint(args[0])), "eval") {
			continue
		}
		for _, a := range args {
			if s, ok := a.(string); ok && s == key {
				return true
			}
		}
	}
	return false
}

func (h *replyStall) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *replyStall) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if h.hit([]redis.Cmder{cmd}) {
			<-h.open
		}
		return err
	}
}
func (h *replyStall) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if h.hit(cmds) {
			<-h.open
		}
		return err
	}
}

// TestForgedGrantsDoNotHideGrant: a waiter's try queues it, and its reply
// is slow; meanwhile the lock is granted to it, and the grant reaches the
// Locker's subscription (other Acquires of the Locker wait on it) before
// the waiter has joined it: the subscription keeps it (recent) for the
// waiter. A client that may publish on the release channel but cannot
// read the keys then publishes eight grants to owners that do not wait,
// which the subscription keeps too, in place of the real one. When the
// try's reply comes, the waiter joins, finds no grant, and, since the
// subscription was confirmed before its try began, sleeps for the
// holder's TTL (a minute), or its whole budget, while the lock is its
// own: held by nobody, and the queue behind it stalls. It must take the
// lock at once.
func TestForgedGrantsDoNotHideGrant(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := srv.Client(t)
	const name = "lock:forged-hide"
	opts := &Options{ReplicaSync: ReplicaSync{Disabled: true}}
	holders, err := New(srv.Client(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	holder, err := holders.Acquire(ctx, name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	c := srv.Client(t)
	k := holders.keys(name)
	stall := &replyStall{key: k.lock, open: make(chan struct{})}
	var once sync.Once
	opened := func() { once.Do(func() { close(stall.open) }) }
	t.Cleanup(opened)
	c.AddHook(stall)
	l, err := New(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	queued := func(n int64) func() bool {
		return func() bool { return admin.LLen(ctx, k.queue).Val() == n }
	}
	// first waits (and subscribes the Locker); when granted, it releases
	// at once, which grants the lock to the next in the queue.
	wait := func(budget time.Duration, done chan<- error) {
		ls, err := l.Acquire(ctx, name, fence.Wait(budget), fence.TTL(time.Minute))
		if err == nil {
			err = ls.Release(ctx)
		}
		done <- err
	}
	first, victim, last := make(chan error, 1), make(chan error, 1), make(chan error, 1)
	go wait(20*time.Second, first)
	// Subscribed after its first try, it tries again at once: its
	// second try is in its entry ("<lease ms> <try> ..."), and it sends
	// nothing more.
	eventually(t, func() bool {
		vals := admin.HVals(ctx, k.waiters).Val()
		return queued(1)() && admin.PubSubNumSub(ctx, k.channel).Val()[k.channel] == 1 &&
			len(vals) == 1 && len(strings.Fields(vals[0])) > 1 && strings.Fields(vals[0])[1] == "2"
	})

	// Armed only once first's two tries have had their replies: armed
	// while the second's was still on its way back, the stall caught it
	// (a loaded run), and first waited out its budget.
	eventually(t, func() bool { return stall.replies() >= 2 })
	stall.arm()
	start := time.Now()
	go wait(5*time.Second, victim)
	eventually(t, queued(2))
	owner := admin.LIndex(ctx, k.queue, 1).Val()
	// last keeps the subscription alive when first leaves it with its lease.
	go wait(20*time.Second, last)
	eventually(t, queued(3))

	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	// The lock is the victim's; the grant waits in the subscription.
	eventually(t, func() bool { return admin.Get(ctx, k.lock).Val() == owner })
	kept := func(owner string) func() bool {
		return func() bool {
			l.mu.Lock()
			defer l.mu.Unlock()
			w := l.subscriptions[k.channel]
			for _, g := range w.recent {
				if g.owner == owner {
					return true
				}
			}
			return false
		}
	}
	eventually(t, kept(owner))
	for i := range 9 {
		forged := fmt.Sprintf("%032x", i+1)
		if i == 8 {
			// A grant to an owner about to join is kept: once it is, the
			// subscription has read the eight forged ones before it.
			l.expectJoin(forged)
			defer l.joined(forged)
		}
		msg := fmt.Sprintf("g %s %d %d 1 0 %040x", forged, int64(1)<<52, int64(1e9), 0)
		if err := admin.Publish(ctx, k.channel, msg).Err(); err != nil {
			t.Fatal(err)
		}
		if i == 8 {
			eventually(t, kept(forged))
		}
	}
	opened()
	select {
	case err := <-victim:
		if err != nil {
			t.Fatalf("the waiter granted the lock while its try's reply was late: %v after %v", err, time.Since(start).Round(time.Millisecond))
		}
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the waiter took %v to take a lock granted to it", took)
	}
	if err := <-last; err != nil {
		t.Fatal(err)
	}
}
