package redislock

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/fencekit/fence/internal/nilctx"
	"github.com/fencekit/fence/internal/pause"
)

// revokeFor is how long the mark that revokes an acquisition given up on
// lives (release.lua). The acquisition and the revocation were both sent
// before the give-up returned, so on a server that was paused or slow they
// run within moments of each other; an acquire command delayed in transit
// for longer than this can still take the lock, for its lease time.
const revokeFor = time.Minute

// releaseAbandoned gives back a lock that an acquisition given up on took
// or may still take, owner-checked: it deletes the lock if the acquisition
// ran, and revokes the owner either way, so that any of its acquisitions
// that runs later refuses. A try that fails on the way (the server paused,
// down or restarting, the pool exhausted) is parked (see parking) and
// tried again within the lease time: the acquisition may still be sitting
// in the server's socket, and unrevoked it would take the lock for a lease
// that nobody holds; a server that kept its data (persistence) has the
// lock when it comes back. It also takes the owner out of the queue of
// waiters.
func (l *Locker) releaseAbandoned(a attempt) { l.withdrawUntil(abandoned(a)) }

// goReleaseAbandoned runs releaseAbandoned(a) in the background, counted
// for WaitGiveBacks.
func (l *Locker) goReleaseAbandoned(a attempt) { l.giveBacks.goRun(func() { l.releaseAbandoned(a) }) }

// WaitGiveBacks waits until the give-backs that failed or cancelled
// Acquires started in the background have been sent (or parked, their
// server not answering: see releaseAbandoned), or ctx ends, and returns
// ctx's error then. A program that exits after an Acquire it cancelled (on
// ^C, say) calls it first: an acquisition that ran on the server while its
// reply was on the way took the lock, and the give-back that releases it
// would die with the program, leaving the lock held by nobody for its
// lease time.
// On a nil Locker it returns made's error (a zero one has nothing to wait for).
func (l *Locker) WaitGiveBacks(ctx context.Context) error {
	if ctx == nil {
		return nilctx.Err("redislock", "WaitGiveBacks")
	}
	if l == nil {
		return l.made()
	}
	return l.giveBacks.wait(ctx)
}

// inflight counts goroutines that WaitGiveBacks waits for.
type inflight struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0; nil while n is 0
}

// goRun runs f in a goroutine of its own, counted until it returns.
func (c *inflight) goRun(f func()) {
	c.mu.Lock()
	if c.n == 0 {
		c.idle = make(chan struct{})
	}
	c.n++
	c.mu.Unlock()
	go func() {
		defer func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.n--; c.n == 0 {
				close(c.idle)
				c.idle = nil
			}
		}()
		f()
	}()
}

// wait returns when none is counted, or with ctx's error when ctx ends first.
func (c *inflight) wait(ctx context.Context) error {
	c.mu.Lock()
	idle := c.idle
	c.mu.Unlock()
	if idle == nil {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// abandoned is releaseAbandoned's give-back of a.
func abandoned(a attempt) giveBack {
	return giveBack{a, max(a.ttl, revokeFor), time.Now().Add(max(a.ttl, time.Second))}
}

// withdraw takes a waiter that leaves without a lease out of the queue, and
// gives back the lock if a grant reached it meanwhile (so that the next
// waiter gets it at once), retrying as releaseAbandoned says; revoke > 0
// also revokes the owner for that long.
func (l *Locker) withdraw(a attempt, revoke time.Duration) {
	l.withdrawUntil(giveBack{a, revoke, time.Now().Add(max(a.ttl, time.Second))})
}

// giveBack is a withdrawal under way: what to release and revoke, and when
// the lock it may hold expires, after which there is nothing to give back.
type giveBack struct {
	a      attempt
	revoke time.Duration
	until  time.Time
}

func (l *Locker) withdrawUntil(g giveBack) {
	ctx, cancel := context.WithDeadline(context.Background(), g.until)
	defer cancel()
	_, err := l.releaseOwned(ctx, &g.a, g.revoke, false)
	if err != nil && transient(err) && ctx.Err() == nil {
		l.parking.park(l, g) // tried again with the others of its server
	}
}

// parking holds the give-backs that failed on their way (refused, reset,
// timed out), for one goroutine per Locker to send again once their server
// answers: while a server is down, every failed Acquire may add one (a
// refusal can end a client's own resends of a try that ran, see
// mayRunLate), and a goroutine each, retrying for the lease time, would
// pile up (TestRefusedAcquiresParkWithOneGoroutine,
// TestResetGiveBacksPileUp). That goroutine tries, with back-off up to a
// second, one parked give-back of each server (a cluster's node or a
// Ring's shard, as the client mapped the lock when it was parked), a
// different one each time, for at most probeFor (a server that hangs does
// not hold it); when one gets through, every other parked give-back of its
// server goes to its own withdrawal (unparkAtOnce at a time for each
// server, handed out by a goroutine of their own while this one goes on
// probing the others), which parks it again if it fails. One at a time for
// all would leave the give-backs of a node that answers again behind those
// of one still down, a second each (TestParkedGiveBackOnLiveNodeNotStarved).
// Each give-back is dropped when its lock would have expired, and the
// goroutine ends when none is left (or, the client closed, as soon as it
// next tries one).
type parking struct {
	mu      sync.Mutex
	parked  []parkedBack
	running bool
	// sending has, for each server, a slot for each of its give-backs
	// being sent again: a server that hangs holds its own slots, not
	// those of the others (TestParkedGiveBackNotBehindHungNode).
	sending map[string]chan struct{}
}

// parkedBack is a parked give-back, kept to what its release needs: a
// whole giveBack is some 600 bytes, and its attempt's home keeps the
// failed Acquire's unused lease (800 more) alive, for as long as the
// lease time while a server is down (TestParkedGiveBackSize).
type parkedBack struct {
	node      string // its lock's server, as primaryFor names it ("" on a client of one)
	k         *keys
	revokeArg any // the owner's revocation mark's key, boxed
	ownerArg  any
	retention any
	revoke    time.Duration
	until     time.Time
}

func parkedOf(g giveBack, node string) parkedBack {
	return parkedBack{node, g.a.keys, g.a.releaseBoxed[5], g.a.releaseArgs[0], g.a.releaseArgs[1], g.revoke, g.until}
}

// giveBack is the give-back that p keeps: its attempt has what
// releaseOwned uses.
func (p *parkedBack) giveBack() giveBack {
	k := p.k
	revokeKey, _ := p.revokeArg.(string)
	return giveBack{attempt{
		keys: k, revokeKey: revokeKey,
		releaseKeys:  [7]string{k.lock, k.token, k.queue, k.waiters, k.waiting, revokeKey, k.releasedBy},
		releaseBoxed: [7]any{k.boxed[0], k.boxed[1], k.boxed[2], k.boxed[3], k.boxed[4], p.revokeArg, k.boxed[5]},
		releaseArgs:  [4]any{p.ownerArg, p.retention, -1, 1},
	}, p.revoke, p.until}
}

const (
	unparkAtOnce = 32          // parked give-backs sent again at a time
	probeFor     = time.Second // the longest wait for a parked give-back's try
)

func (p *parking) park(l *Locker, g giveBack) {
	// The server the client maps the lock to (a cluster's slot map, a
	// Ring's hash), with no round trip: park runs in a failing Acquire,
	// which must return by its caller's deadline, and a cluster client
	// with no slot map would load one. The ctx is done already: such a
	// client fails at once, and its give-backs go with those of no
	// known server ("").
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	node, _, err := l.primaryFor(ctx, g.a.keys.lock)
	if err != nil {
		node = ""
	}
	p.mu.Lock()
	p.parked = append(p.parked, parkedOf(g, node))
	start := !p.running
	p.running = true
	p.mu.Unlock()
	if start {
		go p.unpark(l)
	}
}

// probe is a parked give-back tried by the parking's goroutine.
type probe struct {
	i        int // in parked
	g        giveBack
	answered bool // got through (or failed for good): its server answers
}

// unpark is the parking's goroutine.
func (p *parking) unpark(l *Locker) {
	for tries := 1; ; tries++ {
		pause.For(context.Background(), pause.Backoff(tries))
		p.mu.Lock()
		now := time.Now()
		p.parked = slices.DeleteFunc(p.parked, func(g parkedBack) bool { return !now.Before(g.until) })
		if len(p.parked) == 0 {
			p.parked, p.running = nil, false
			p.mu.Unlock()
			return
		}
		probes := p.pick(tries)
		p.mu.Unlock()
		if len(probes) == 1 {
			probes[0].try(l)
		} else {
			var wg sync.WaitGroup
			for k := range probes {
				wg.Add(1)
				go func() { defer wg.Done(); probes[k].try(l) }()
			}
			wg.Wait()
		}
		// A server that answers again (or the client closed): send its
		// other parked give-backs again, a few at a time. (Parks
		// meanwhile only appended.)
		p.mu.Lock()
		answered := map[string]bool{}
		skip := map[int]bool{}
		for _, pr := range probes {
			if pr.answered {
				answered[p.parked[pr.i].node] = true
				skip[pr.i] = true
			}
		}
		if len(answered) == 0 {
			p.mu.Unlock()
			continue
		}
		send := map[string][]parkedBack{}
		keep := p.parked[:0]
		for j, g := range p.parked {
			switch {
			case !answered[g.node]:
				keep = append(keep, g)
			case !skip[j]:
				send[g.node] = append(send[g.node], g)
			}
		}
		clear(p.parked[len(keep):])
		p.parked = keep
		if p.sending == nil {
			p.sending = map[string]chan struct{}{}
		}
		for node, batch := range send {
			slots := p.sending[node]
			if slots == nil {
				slots = make(chan struct{}, unparkAtOnce)
				p.sending[node] = slots
			}
			// Not here: this goroutine goes on probing the others.
			go p.send(l, slots, batch)
		}
		p.mu.Unlock()
		tries = 0
	}
}

// send hands each give-back of batch to its own withdrawal, as slots
// allow.
func (p *parking) send(l *Locker, slots chan struct{}, batch []parkedBack) {
	for j := range batch {
		h := batch[j].giveBack()
		slots <- struct{}{}
		go func() {
			defer func() { <-slots }()
			l.withdrawUntil(h)
		}()
	}
}

// pick returns one parked give-back of each server to try, the tries-th of
// its server's, in the order parked. p.mu is held.
func (p *parking) pick(tries int) []probe {
	count := map[string]int{}
	for _, g := range p.parked {
		count[g.node]++
	}
	probes := make([]probe, 0, len(count))
	seen := map[string]int{}
	for i, g := range p.parked {
		if seen[g.node] == tries%count[g.node] {
			probes = append(probes, probe{i: i, g: g.giveBack()})
		}
		seen[g.node]++
	}
	return probes
}

// try sends pr's give-back once, for at most probeFor.
func (pr *probe) try(l *Locker) {
	ctx, cancel := context.WithDeadline(context.Background(), pr.g.until)
	defer cancel()
	ctx, cancelProbe := context.WithTimeout(ctx, probeFor)
	defer cancelProbe()
	_, err := l.releaseOwned(ctx, &pr.g.a, pr.g.revoke, false)
	// Through (or refused for good, the client closed): its server
	// answers. Not on a transient error, nor when the probe's own time ran
	// out (a server that hangs).
	pr.answered = err == nil || !transient(err) && ctx.Err() == nil
}
