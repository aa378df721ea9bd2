package redlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/nilctx"
	"github.com/redis/go-redis/v9"
)

// ErrClosed means the Locker was closed: Acquire after Close (or an
// acquisition that Close overtook, whose lease was released at once) sends
// nothing and returns an error matching fence.ErrNotAcquired, ErrClosed
// and fence.ErrClosed (on which fence.Lead stops campaigning).
var ErrClosed = fmt.Errorf("redlock: %w", fence.ErrClosed)

// CloseError means Close's context ended before the Locker's background
// work did: the releases still on their way to the nodes listed (a node
// hung or partitioned) were stopped, and each of those nodes may keep the
// lock it was releasing until its lease time runs out. A majority of the
// nodes is free (the releases returned once a majority had deleted the
// lock), so no lease's safety depends on it; another owner may only have
// to wait for a majority of free nodes on every try. It matches the
// context's error. A later Close, once the work left has finished, returns
// one too (with that first context's error) if releases were stopped
// before they reached their nodes.
type CloseError struct {
	// Nodes are the positions, in New's clients, of the nodes whose
	// background requests had not finished, with their addresses
	// where their clients tell them; none when only acquisitions (or
	// renewals) under way were left, between their requests.
	Nodes []int
	Addrs []string
	// Left is how many background requests (and acquisitions and
	// renewals under way) had not finished.
	Left int
	// Err is the context's error.
	Err error
}

func (e *CloseError) Error() string {
	if len(e.Nodes) == 0 {
		// Only acquisitions (or renewals) under way, between their
		// requests (the first contact's ping, say).
		return fmt.Sprintf("redlock: close: %d acquisitions or renewals under way not finished: %v", e.Left, e.Err)
	}
	names := make([]string, len(e.Nodes))
	for k, i := range e.Nodes {
		names[k] = fmt.Sprintf("node %d", i)
		if e.Addrs[k] != "" {
			names[k] += " (" + e.Addrs[k] + ")"
		}
	}
	return fmt.Sprintf("redlock: close: %d background requests not finished, on %s: %v", e.Left, strings.Join(names, ", "), e.Err)
}

// Unwrap returns the context's error.
func (e *CloseError) Unwrap() error { return e.Err }

// background is a Locker's work that goes on after the call that started
// it has returned: the releases that Release does not wait for, the
// requests of an acquisition still out when it was decided (a late grant
// is given back by them), the releases of failed tries, and their retries.
// Close waits for it.
type background struct {
	// ctx ends the retries of the work, once Close has given up waiting
	// for it. A first request is never sent under it: work that an
	// acquisition under way starts after Close gave up (the give-back
	// of its try) is still sent once, bounded by the node timeout (on
	// the socket only with ContextTimeoutEnabled; otherwise by the
	// client's read timeout), or the running nodes would keep that try's
	// lock for the lease time.
	ctx    context.Context
	cancel context.CancelFunc

	closed atomic.Bool // Close was called (also set under mu)

	mu      sync.Mutex
	left    int                 // requests and retries not finished
	perNode []int               // left, by node
	idle    chan struct{}       // made by a waiting Close, closed when left drops to 0
	leases  map[*lease]struct{} // leases not ended, which Close releases
	// stopped counts, by node, the releases that a Close which gave up
	// stopped before they reached their node (its lock may stay there
	// until the lease time runs out), and stopErr is that Close's
	// context error: every later Close reports them.
	stopped []int
	stopErr error

	// park ends the retries of releases on nodes that refused the
	// connection (see parkRelease): Close cancels it and does not report
	// them. parkQ holds them by node, retried by one goroutine per node
	// (parkRun), not one per release; parkedN counts those goroutines
	// (under mu); parkIdle, made by a waiting Close, is closed when it
	// drops to 0.
	park       context.Context
	parkCancel context.CancelFunc
	parkQ      [][]parkedRelease
	parkRun    []bool
	parkedN    int
	parkIdle   chan struct{}
}

// parkedRelease is a release waiting, on a node that refused the
// connection, for the node to come back, until its deadline.
type parkedRelease struct {
	keys  []string
	args  []any
	until time.Time
}

func (b *background) init(n int) {
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.park, b.parkCancel = context.WithCancel(context.Background())
	b.parkQ = make([][]parkedRelease, n)
	b.parkRun = make([]bool, n)
	b.perNode = make([]int, n)
	b.stopped = make([]int, n)
	b.leases = make(map[*lease]struct{})
}

// add counts a piece of background work on node i; done must follow.
func (b *background) add(i int) {
	b.mu.Lock()
	b.left++
	b.perNode[i]++
	b.mu.Unlock()
}

// addAll counts one piece on every node of n.
func (b *background) addAll(n int) {
	b.mu.Lock()
	b.left += n
	for i := range n {
		b.perNode[i]++
	}
	b.mu.Unlock()
}

// done ends a piece of work counted by add on node i.
func (b *background) done(i int) {
	b.mu.Lock()
	b.left--
	b.perNode[i]--
	if b.left == 0 && b.idle != nil {
		close(b.idle)
		b.idle = nil
	}
	b.mu.Unlock()
}

// parkPush queues r on node i; it reports whether the caller must start
// the node's retry goroutine (drainParked), which then calls parkNext
// until it returns false. It queues nothing once Close has ended the
// retries, or on a Locker not made by New.
func (b *background) parkPush(i int, r parkedRelease) (start bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.park == nil || b.park.Err() != nil {
		return false // a Locker not made by New, or closed
	}
	b.parkQ[i] = append(b.parkQ[i], r)
	if b.parkRun[i] {
		return false
	}
	b.parkRun[i] = true
	b.parkedN++
	return true
}

// parkNext drops node i's releases past their deadline (all of them once
// Close has ended the retries) and returns the first one left; when none
// is, it ends the node's retry goroutine and returns false.
func (b *background) parkNext(i int, now time.Time) (parkedRelease, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	q := b.parkQ[i]
	if b.park.Err() != nil {
		q = q[:0]
	}
	q = slices.DeleteFunc(q, func(r parkedRelease) bool { return !now.Before(r.until) })
	b.parkQ[i] = q
	if len(q) > 0 {
		return q[0], true
	}
	b.parkQ[i] = nil // let a long queue's array go
	b.parkRun[i] = false
	b.parkedN--
	if b.parkedN == 0 && b.parkIdle != nil {
		close(b.parkIdle)
		b.parkIdle = nil
	}
	return parkedRelease{}, false
}

// parkPop removes node i's first release (the one parkNext returned: only
// the node's retry goroutine removes any), once the node answered it.
func (b *background) parkPop(i int) {
	b.mu.Lock()
	b.parkQ[i] = b.parkQ[i][1:]
	b.mu.Unlock()
}

// parkClear drops node i's releases: its client was closed.
func (b *background) parkClear(i int) {
	b.mu.Lock()
	b.parkQ[i] = b.parkQ[i][:0]
	b.mu.Unlock()
}

// unpark ends the parked retries and waits, until ctx ends, for their
// goroutines to return (at once, or when a request in flight ends).
func (b *background) unpark(ctx context.Context) {
	b.mu.Lock()
	if b.parkCancel != nil { // nil on a Locker not made by New
		b.parkCancel()
	}
	if b.parkedN == 0 {
		b.mu.Unlock()
		return
	}
	if b.parkIdle == nil {
		b.parkIdle = make(chan struct{})
	}
	idle := b.parkIdle
	b.mu.Unlock()
	select {
	case <-idle:
	case <-ctx.Done():
	}
}

// stop records that a release on node i was stopped by a Close that gave
// up, before it reached the node.
func (b *background) stop(i int) {
	b.mu.Lock()
	b.stopped[i]++
	b.mu.Unlock()
}

// stoppedErrorLocked returns the *CloseError that reports the releases
// stopped by a Close that gave up, nil if none was; b.mu is held.
func (b *background) stoppedErrorLocked(l *Locker) *CloseError {
	var ce *CloseError
	for i, n := range b.stopped {
		if n > 0 {
			if ce == nil {
				ce = &CloseError{Err: b.stopErr}
			}
			ce.Nodes = append(ce.Nodes, i)
			ce.Addrs = append(ce.Addrs, l.addr(i))
			ce.Left += n
		}
	}
	return ce
}

// enter counts an acquisition try as work under way (not tied to a node),
// so that Close waits for it; it returns false, counting nothing, once Close
// was called. leave must follow a true.
func (b *background) enter() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return false
	}
	b.left++
	return true
}

// busy counts a renewal as work under way (not tied to a node), whether or
// not Close was called: a renewal that ran on the nodes just before its
// lease's deadline moves the lock there, and gives it back once it reads
// that the lease ended meanwhile (renew); Close, which has nothing of an
// ended lease to release, waits for that. leave must follow.
func (b *background) busy() {
	b.mu.Lock()
	b.left++
	b.mu.Unlock()
}

// leave ends a try counted by enter, or a renewal counted by busy.
func (b *background) leave() {
	b.mu.Lock()
	b.left--
	if b.left == 0 && b.idle != nil {
		close(b.idle)
		b.idle = nil
	}
	b.mu.Unlock()
}

// register lists a new lease for Close to release; it returns false, doing
// nothing, once Close was called.
func (b *background) register(ls *lease) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return false
	}
	b.leases[ls] = struct{}{}
	return true
}

// forget takes an ended lease off the list.
func (b *background) forget(ls *lease) {
	b.mu.Lock()
	delete(b.leases, ls)
	b.mu.Unlock()
}

// Close releases the leases of this Locker still held, then waits, until
// ctx ends, for the Locker's background work to finish: the releases that
// Release returned without waiting for (it returns once a majority deleted
// the lock), the give-back of grants that came after their acquisition was
// decided, and the releases of failed tries, with their retries; and for
// the acquisitions and renewals under way (a renewal that reads that its
// lease ended meanwhile gives back the lock it moved). It ends, without
// waiting for them or reporting them, the retries of releases that a node
// refused the connection for (see Release): a node down for the rest of
// the lease would otherwise hold every Close for that long. A program
// should call it before it exits: that work dies with the process, and a
// node it had not reached yet keeps the lock until the lease time runs out
// (safety is unaffected, since a majority is free, but the next owner may
// have to wait for that node on a try where another is slow).
//
// Close returns nil once everything is done, the errors of the releases of
// leases still held (as their Release would have returned them), and a
// *CloseError naming the nodes whose requests had not finished if ctx
// ended first: the retries are then stopped, and requests in flight end
// when their client gives up on them, within its read timeout (go-redis
// takes no socket deadline from the context unless ContextTimeoutEnabled is
// set; a later Close waits for them). An acquisition under way still gives
// its try back afterwards, one request per node, not retried, each ending
// as any request does (a later Close may so wait a read timeout for a node
// still hung). A later Close reports again, in a
// *CloseError matching the first one's context error, the nodes where a
// release was stopped before it reached them, rather than nil. It closes
// nothing it was given: the clients stay open, for the caller to close
// after Close.
//
// After Close, Acquire returns an error matching fence.ErrNotAcquired and
// ErrClosed, and sends nothing; an Acquire under way when Close is called
// either returns a lease that Close releases, or releases its lease itself
// and returns that error. Release of a lease that Close released returns
// what Close's release returned; Extend of it, the lease's Err. Status goes
// on working. Close is safe to call concurrently and more than once. A nil
// ctx is refused with an error matching fence.ErrInvalidOption, the Locker
// left open and its leases held.
//
// Close is the Locker's counterpart of etcd's concurrency.Session.Close,
// which revokes the session's lease and with it every lock it holds: a
// Locker's leases outlive no Close. A program that wants its lock held
// after it exits (until the lease time) should not call Close.
func (l *Locker) Close(ctx context.Context) error {
	if l == nil {
		return l.made() // a zero Locker has nothing to release: it goes on
	}
	if ctx == nil {
		return nilctx.Err("redlock", "Close")
	}
	b := &l.bg
	b.mu.Lock()
	b.closed.Store(true)
	held := make([]*lease, 0, len(b.leases))
	for ls := range b.leases {
		held = append(held, ls)
	}
	b.mu.Unlock()
	var errs []error
	if len(held) > 0 {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, ls := range held {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := ls.Err(); err != nil && !errors.Is(err, fence.ErrReleased) {
					// It ran out (unwatched: no timer ended it
					// and took it off the list) or was lost: not
					// held, nothing of it to release.
					return
				}
				if err := ls.Release(ctx); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
	}
	// Releases on nodes that refused the connection are retried while
	// the Locker is open (parkRelease); Close ends them.
	b.unpark(ctx)
	// done reports, once the work has finished, the releases that an
	// earlier Close which gave up stopped.
	done := func() error {
		b.mu.Lock()
		ce := b.stoppedErrorLocked(l)
		b.mu.Unlock()
		if ce != nil {
			errs = append(errs, ce)
		}
		return errors.Join(errs...)
	}
	b.mu.Lock()
	if b.left == 0 {
		b.mu.Unlock()
		return done()
	}
	if b.idle == nil {
		b.idle = make(chan struct{})
	}
	idle := b.idle
	b.mu.Unlock()
	select {
	case <-idle:
		return done()
	case <-ctx.Done():
	}
	b.mu.Lock()
	if b.stopErr == nil {
		b.stopErr = ctx.Err()
	}
	b.mu.Unlock()
	b.cancel()
	b.mu.Lock()
	ce := &CloseError{Left: b.left, Err: ctx.Err()}
	for i, n := range b.perNode {
		if n > 0 || b.stopped[i] > 0 {
			ce.Nodes = append(ce.Nodes, i)
			ce.Addrs = append(ce.Addrs, l.addr(i))
			ce.Left += b.stopped[i]
		}
	}
	b.mu.Unlock()
	if ce.Left == 0 {
		// Finished as ctx ended.
		return errors.Join(errs...)
	}
	return errors.Join(append(errs, ce)...)
}

// addr is node i's address, when its client tells it.
func (l *Locker) addr(i int) string {
	if o, ok := l.nodes[i].(interface{ Options() *redis.Options }); ok && o.Options() != nil {
		return o.Options().Addr
	}
	return ""
}
