package redislock_test

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// taggedClient is a caller's own UniversalClient, passed by value: a
// *redis.Client with a map beside it, which makes the type uncomparable.
type taggedClient struct {
	*redis.Client
	tags map[string]string
}

// TestCustomClientByValue: New accepts any UniversalClient. One passed by
// value whose type cannot be compared (it holds a map) must work with
// replica sync as it does without: no panic comparing it with a node's
// client when choosing a pipeline.
func TestCustomClientByValue(t *testing.T) {
	primary := redistest.Start(t)
	redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	for _, sync := range []bool{false, true} {
		l := lockerWith(t, taggedClient{primary.Client(t), map[string]string{"team": "payments"}},
			redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: !sync}})
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("sync=%v: Acquire panicked: %v", sync, p)
				}
			}()
			lease, err := l.Acquire(ctx(t), "by-value", fence.TTL(time.Minute))
			if err != nil {
				t.Fatalf("sync=%v: Acquire: %v", sync, err)
			}
			if err := lease.Release(ctx(t)); err != nil {
				t.Fatalf("sync=%v: Release: %v", sync, err)
			}
		}()
	}
}

// switchingClient is a caller's UniversalClient that moves to another
// server (a manual failover, a new address after a credentials rotation)
// by swapping the *redis.Client it sends through. It forwards what fence
// uses: the script commands and Pipeline.
type switchingClient struct {
	*redis.Client // the first one: the methods fence does not use
	cur           atomic.Pointer[redis.Client]
}

func (s *switchingClient) Pipeline() redis.Pipeliner { return s.cur.Load().Pipeline() }
func (s *switchingClient) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return s.cur.Load().Eval(ctx, script, keys, args...)
}
func (s *switchingClient) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return s.cur.Load().EvalSha(ctx, sha, keys, args...)
}

// TestSwitchingClient: a Locker on a client that switched servers must
// send every command, the replica-synced acquisition's pipeline included,
// to the server the client sends to now. Else the lock is written on the
// old server, where no Locker of the new one sees it: two holders.
func TestSwitchingClient(t *testing.T) {
	t.Parallel() // own servers; mostly waits for them to start
	oldSrv, newSrv := redistest.Start(t), redistest.Start(t)
	redistest.StartReplica(t, oldSrv)
	redistest.StartReplica(t, newSrv)
	redistest.WaitReplicated(t, oldSrv, 1)
	redistest.WaitReplicated(t, newSrv, 1)
	sc := &switchingClient{Client: oldSrv.Client(t)}
	sc.cur.Store(sc.Client)
	l := lockerWith(t, sc, redislock.Options{})
	// Busy before the switch: acquisitions in parallel.
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			lease, err := l.Acquire(ctx(t), fmt.Sprintf("before-switch-%d", i), fence.TTL(time.Minute))
			if err != nil {
				t.Error(err)
				return
			}
			_ = lease.Release(ctx(t))
		})
	}
	wg.Wait()

	sc.cur.Store(newSrv.Client(t))
	other := lockerWith(t, newSrv.Client(t), redislock.Options{})
	for i := range 16 {
		name := fmt.Sprintf("after-switch-%d", i)
		lease := acquire(t, l, name, fence.TTL(time.Minute))
		if n := oldSrv.Client(t).Exists(ctx(t), lockKey(name)).Val(); n != 0 {
			t.Errorf("%s: the lock was written on the server the client left", name)
		}
		if second, err := other.Acquire(ctx(t), name, fence.TTL(time.Minute)); err == nil {
			_ = second.Release(ctx(t))
			t.Fatalf("a Locker on the new server took %q while it was held: two holders (tokens %d and %d)", name, lease.Token(), second.Token())
		}
		_ = lease.Release(ctx(t))
	}
}

// redactingHook scrubs the arguments of every command after it ran, in
// place, before handing them to a log: a careless hook, but nothing in
// go-redis forbids it, and a command's arguments are its own.
type redactingHook struct{ logged atomic.Int64 }

func (h *redactingHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *redactingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.redact(cmd)
		return err
	}
}
func (h *redactingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			h.redact(cmd)
		}
		return err
	}
}
func (h *redactingHook) redact(cmd redis.Cmder) {
	args := cmd.Args()
	for i := 1; i < len(args); i++ {
		args[i] = "?"
	}
	h.logged.Add(1)
}

// TestHookRewritesArgs: a hook that rewrites a command's arguments after it
// ran (added after New, as a service adds its logging later) must not
// change the commands of the next acquisitions: each command's arguments
// are its own, WAIT's included.
func TestHookRewritesArgs(t *testing.T) {
	primary := redistest.Start(t)
	redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	c := primary.Client(t)
	l := lockerWith(t, c, redislock.Options{})
	var h redactingHook
	c.AddHook(&h)
	for i := range 3 {
		lease, err := l.Acquire(ctx(t), "redacted", fence.TTL(time.Minute))
		if err != nil {
			t.Fatalf("acquisition %d after a hook redacted the last one's commands: %v", i, err)
		}
		if err := lease.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
	if h.logged.Load() == 0 {
		t.Fatal("the hook saw no command")
	}
}

// refusals counts replica-sync refusals, of tries as well as of Acquires.
type refusals struct {
	fence.NopObserver
	atomic.Int64
}

func (r *refusals) ReplicaSyncRefused(fence.ReplicaSyncEvent) { r.Add(1) }

// TestSyncedStorm: 64 goroutines acquire and release 16 names with
// replica sync on (and, for the other path, off), each Acquire with a random deadline of 5 to 205 ms (and a wait budget beyond it) (so
// that many are given up on mid-pipeline, with the call still using its
// pooled pipeline), while the replica is paused, resumed, killed and
// restarted and the script cache flushed, in turns set by the number of
// attempts made. Every lease must be the only one of its name, with a token
// above the name's last; a refusal must leave nothing locked, and once all
// is done and the given-up-on acquisitions are given back, no lock remains.
func TestSyncedStorm(t *testing.T) {
	for _, tc := range []struct{ cte, sync bool }{{false, true}, {true, true}, {false, false}} {
		cte := tc.cte
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v/sync=%v", cte, tc.sync), func(t *testing.T) {
			primary := redistest.Start(t)
			replica := redistest.StartReplica(t, primary)
			t.Cleanup(func() { replica.Signal(syscall.SIGCONT) })
			redistest.WaitReplicated(t, primary, 1)
			c := redis.NewClient(&redis.Options{Addr: primary.Addr, ContextTimeoutEnabled: cte})
			t.Cleanup(func() { _ = c.Close() })
			admin := primary.Client(t)
			var refused refusals
			l := lockerWith(t, c, redislock.Options{Observer: &refused, ReplicaSync: redislock.ReplicaSync{Disabled: !tc.sync, Timeout: 30 * time.Millisecond}})

			var names []string
			for i := range 16 {
				names = append(names, fmt.Sprintf("storm-%d", i))
			}
			var errMu sync.Mutex
			errs := map[string]int{}
			type state struct {
				mu   sync.Mutex
				held bool
				last fence.Token
			}
			states := make(map[string]*state)
			for _, n := range names {
				states[n] = &state{}
			}
			var attempts, acquired atomic.Int64
			chaos := make(chan int64, 1024)
			var wg sync.WaitGroup
			for g := range 64 {
				wg.Go(func() {
					rng := mrand.New(mrand.NewPCG(uint64(g), 1))
					for range 30 {
						name := names[rng.IntN(len(names))]
						actx, cancel := context.WithTimeout(context.Background(), time.Duration(5+rng.IntN(200))*time.Millisecond)
						lease, err := l.Acquire(actx, name, fence.TTL(10*time.Second), fence.Wait(time.Second))
						cancel()
						if n := attempts.Add(1); n%64 == 0 {
							select {
							case chaos <- n / 64:
							default:
							}
						}
						if err != nil {
							errMu.Lock()
							why := err.Error()
							if strings.Contains(why, "release after failed sync") {
								why = "release after failed sync"
							} else {
								why = why[strings.LastIndex(why, ": ")+2:]
							}
							errs[why]++
							errMu.Unlock()
							if !errors.Is(err, fence.ErrNotAcquired) {
								t.Errorf("Acquire: %v, not an ErrNotAcquired", err)
							}
							continue
						}
						acquired.Add(1)
						s := states[name]
						s.mu.Lock()
						if s.held {
							t.Errorf("%s: token %d granted while another lease held it", name, lease.Token())
						}
						if lease.Token() <= s.last {
							t.Errorf("%s: token %d after %d", name, lease.Token(), s.last)
						}
						s.held, s.last = true, lease.Token()
						s.mu.Unlock()
						rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
						s.mu.Lock()
						s.held = false
						s.mu.Unlock()
						if err := lease.Release(rctx); err != nil {
							t.Errorf("%s: Release: %v", name, err)
						}
						rcancel()
					}
				})
			}
			done := make(chan struct{})
			var chaosWG sync.WaitGroup
			chaosWG.Go(func() {
				for {
					select {
					case <-done:
						return
					case n := <-chaos:
						cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
						_ = admin.ScriptFlush(cctx).Err()
						switch n % 4 {
						case 0:
							replica.Signal(syscall.SIGSTOP)
						case 1:
							replica.Signal(syscall.SIGCONT)
						case 2:
							replica.Kill()
						case 3:
							if err := replica.Relaunch(); err != nil {
								t.Errorf("restart the replica: %v", err)
							}
						}
						cancel()
					}
				}
			})
			wg.Wait()
			close(done)
			chaosWG.Wait()
			t.Logf("%d attempts: %d leases, %d tries refused by replica sync; errors %v", attempts.Load(), acquired.Load(), refused.Load(), errs)
			if acquired.Load() == 0 || tc.sync && refused.Load() == 0 {
				t.Errorf("the storm did not test both outcomes")
			}
			// The given-up-on acquisitions give their locks back in the
			// background, within their lease time.
			polled := time.Now()
			deadline := polled.Add(15 * time.Second)
			defer func() { t.Logf("no lock left after %v", time.Since(polled)) }()
			for {
				left := 0
				for _, n := range names {
					left += int(admin.Exists(ctx(t), lockKey(n)).Val())
				}
				if left == 0 {
					break
				}
				if time.Since(polled) > time.Second {
					for _, n := range names {
						if ttl := admin.PTTL(ctx(t), lockKey(n)).Val(); ttl > 0 {
							owner := admin.Get(ctx(t), lockKey(n)).Val()
							revoked := admin.Exists(ctx(t), lockKey(n)+":revoked:"+owner).Val()
							t.Errorf("%s still locked a second after the storm, for %v more, by %s (revoked: %d)", n, ttl, owner, revoked)
						}
					}
					t.FailNow()
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d locks still held after every lease was released", left)
				}
				time.Sleep(10 * time.Millisecond) // polling with a deadline
			}
		})
	}
}

// TestRing: whatever a *redis.Ring did before the Locker pooled its
// pipelines it must still do: here, with one shard, work, replica sync
// included (ring_test.go has Rings of several shards).
func TestRing(t *testing.T) {
	primary := redistest.Start(t)
	redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"one": primary.Addr}})
	t.Cleanup(func() { _ = ring.Close() })
	for _, sync := range []bool{false, true} {
		l := lockerWith(t, ring, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: !sync}})
		for range 3 {
			lease, err := l.Acquire(ctx(t), "ring", fence.TTL(time.Minute))
			if err != nil {
				t.Fatalf("sync=%v: Acquire on a Ring: %v", sync, err)
			}
			if err := lease.Release(ctx(t)); err != nil {
				t.Fatalf("sync=%v: Release on a Ring: %v", sync, err)
			}
		}
	}
}

// recordingHook keeps every pipelined command's arguments, as a tracer that
// builds its spans later does, with what they were when sent.
type recordingHook struct {
	mu   sync.Mutex
	args [][]any
	sent []string
}

func (h *recordingHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *recordingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *recordingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.mu.Lock()
		for _, cmd := range cmds {
			h.args = append(h.args, cmd.Args())
			h.sent = append(h.sent, fmt.Sprint(cmd.Args()...))
		}
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

// TestHookKeepsArgs: arguments a hook keeps must stay what was sent, while
// acquisitions with other names, owners and lease times (and WAIT counts)
// follow from many goroutines: no command's arguments are storage that a
// later command reuses.
func TestHookKeepsArgs(t *testing.T) {
	t.Parallel() // own servers; mostly waits for them to start
	primary := redistest.Start(t)
	redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	c := primary.Client(t)
	var h recordingHook
	c.AddHook(&h)
	l := lockerWith(t, c, redislock.Options{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 20 {
				lease, err := l.Acquire(ctx(t), fmt.Sprintf("kept-%d-%d", g, i), fence.TTL(time.Duration(1+i)*time.Second))
				if err != nil {
					t.Error(err)
					return
				}
				_ = lease.Release(ctx(t))
			}
		})
	}
	wg.Wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.args) < 8*20*2 {
		t.Fatalf("the hook saw %d pipelined commands, want the acquisitions' script and WAIT", len(h.args))
	}
	for i, args := range h.args {
		if now := fmt.Sprint(args...); now != h.sent[i] {
			t.Fatalf("command %d's arguments changed after it was sent: %q, now %q", i, h.sent[i], now)
		}
	}
}

// TestHungPrimaryPooledPipelines: acquisitions given up on while the primary
// hangs keep their pooled pipelines (the call goes on, on its goroutine);
// when the primary answers again, their late replies must go to them alone,
// and the acquisitions that follow on the same pool must see their own
// script reply and WAIT count: each taken once, with increasing tokens, and
// nothing left locked once the given-up-on ones are given back.
func TestHungPrimaryPooledPipelines(t *testing.T) {
	primary := redistest.Start(t)
	redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	t.Cleanup(func() { primary.Signal(syscall.SIGCONT) })
	c := primary.Client(t)
	admin := primary.Client(t)
	if err := admin.Ping(ctx(t)).Err(); err != nil {
		t.Fatal(err)
	}
	var refused refusals
	l := lockerWith(t, c, redislock.Options{Observer: &refused})
	for i := range 16 { // warm the pool and the connections
		lease := acquire(t, l, fmt.Sprintf("hung-%d", i), fence.TTL(time.Minute))
		if err := lease.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
	primary.Signal(syscall.SIGSTOP)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			actx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			if lease, err := l.Acquire(actx, fmt.Sprintf("hung-%d", i), fence.TTL(time.Minute)); err == nil {
				t.Errorf("Acquire on a hung primary returned lease %d", lease.Token())
			}
		})
	}
	wg.Wait()
	primary.Signal(syscall.SIGCONT)
	var last fence.Token
	for i := range 20 {
		lease := acquire(t, l, "after-hang", fence.TTL(time.Minute))
		if lease.Token() <= last {
			t.Fatalf("acquisition %d after the hang: token %d after %d", i, lease.Token(), last)
		}
		last = lease.Token()
		if err := lease.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
	if n := refused.Load(); n != 0 {
		t.Fatalf("%d acquisitions refused by replica sync with the replica up", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; i < 16; {
		if admin.Exists(ctx(t), lockKey(fmt.Sprintf("hung-%d", i))).Val() == 0 {
			i++
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("hung-%d still locked 10 s after the primary answered again", i)
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
}
