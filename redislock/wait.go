package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencekit/fence/internal/pause"
	"github.com/redis/go-redis/v9"
)

// subscription is one subscription to a lock's release channel, shared by
// every Acquire of this Locker that waits on that lock, with its waiters. A
// grant goes to the waiter it names, if it is one of them; a legacy
// "released" message wakes one local waiter, not all of them: only one can
// win.
//
// The subscription belongs to none of its waiters: its reader goroutine
// subscribes with the subscription's own context, so a waiter whose budget
// ends during the subscribe leaves without failing the others. It lives
// while someone waits; when the last waiter leaves, it is taken out of
// Locker.subscriptions and its reader ends. One that failed is taken out at
// once, so the next waiter subscribes afresh.
type subscription struct {
	channel string
	waiters []*waiter // in arrival order; guarded by Locker.mu
	// recent keeps the last grants for owners that were not among the
	// waiters but are about to join (Locker.joining): a waiter joins after
	// its try, and the grant may come first. Grants to other owners are
	// not kept: anyone who may publish on the channel can send them, and
	// they would push a joining waiter's grant out. Guarded by Locker.mu.
	recent     [8]grantMsg
	recentNext int
	// last is the latest grant delivered, to whomever: a waiter whose
	// try was in flight (or that had not joined yet) when it came sets
	// its timer no later than its end (see setTimer). Guarded by
	// Locker.mu.
	last   lastGrant
	ps     *redis.PubSub // set by the reader once subscribed; guarded by Locker.mu
	closed bool          // the last waiter has left; guarded by Locker.mu
	stop   context.CancelFunc

	readyOnce sync.Once
	ready     chan struct{} // closed when the subscription is confirmed or failed
	readyErr  error
	readyAt   time.Time // when it was confirmed
	// again is when it was last confirmed again after a break (zero:
	// never); guarded by Locker.mu. A waiter that joins later than that
	// wake-up, after a try made during the break, must try again (join).
	again time.Time
	// kinds is how many subscriptions (SUBSCRIBE, SSUBSCRIBE) the channel
	// has on the connection: it is confirmed when each of them is. Set by
	// subscribe before its confirmations are read.
	kinds int
	// handing counts this Locker's releases of the lock in flight with
	// WAIT (see Locker.releaseLease); guarded by Locker.mu. While one is,
	// a waiter that needs its grant confirmed waits for it rather than
	// confirm the grant itself.
	handing int
}

// lastGrant is a grant as a subscription saw it: to whom, when it was
// delivered, and when it ends by the local clock.
type lastGrant struct {
	owner      string
	seen, ends time.Time
}

// waiter is one waiting Acquire on a subscription. Its fields but owner,
// wake and sub are guarded by Locker.mu.
type waiter struct {
	owner string
	wake  chan struct{} // capacity 1: rung when one of the fields below is set
	sub   *subscription // the one it waits on, set before it joins

	grant  grantMsg  // the grant sent to owner, if grant.owner is set
	tryNow bool      // a legacy release or a lost subscription: try again
	until  time.Time // when the waiter's timer fires (zero: no timer)
	retime time.Time // the lock was granted to another owner until then, before until
	// own is when the timer was set to fire from the waiter's own try (the
	// holder's TTL): grants to other owners, which the waiter cannot
	// check, move until no later than that (see deliver).
	own time.Time
	// until was set by a grant to another owner (deliver), not from a
	// try's reply: a later grant supersedes it, earlier or later.
	byGrant bool
	// synced is the token of a grant to owner that a release of this
	// Locker covered with its WAIT (zero: none; see Locker.releaseLease).
	synced int64
	// lasting is until when a grant to owner would give a whole lease
	// (its budget's end less the lease time), and so be taken without a
	// confirming try if a release's WAIT covered it (zero: never).
	lasting time.Time
	// heldSince is when taken first held back the grant it holds (zero:
	// none held back); see taken.
	heldSince time.Time
}

// ring wakes w. l.mu is held.
func (w *waiter) ring() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// grantMsg is a grant published by the release (or acquire) script: the
// lock is owner's with token for px ms, counted from when the script ran,
// after owner's try number try (see grant.lua); server is the server's
// clock then, ms; mac proves that the script wrote it (see granted).
type grantMsg struct {
	owner             string
	token, px, server int64
	try               int
	mac, signed       string // the MAC, and the text it signs
}

// parseGrant reads "g <owner> <token> <px> <try> <server ms> <mac>".
func parseGrant(msg string) (grantMsg, bool) {
	f := strings.Fields(msg)
	if len(f) != 7 || f[0] != "g" || len(f[1]) != ownerLen {
		return grantMsg{}, false
	}
	token, err1 := strconv.ParseInt(f[2], 10, 64)
	px, err2 := strconv.ParseInt(f[3], 10, 64)
	try, err3 := strconv.Atoi(f[4])
	server, err4 := strconv.ParseInt(f[5], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || token <= 0 || px <= 0 || try <= 0 {
		return grantMsg{}, false
	}
	signed := strings.Join(f[2:6], " ")
	return grantMsg{owner: f[1], token: token, px: px, try: try, server: server, mac: f[6], signed: signed}, true
}

// join registers owner's waiter on channel, subscribing if nobody local is
// subscribed yet, and returns once the server has confirmed the
// subscription, so that no grant published after join returns is missed.
// readyAt is when the subscription was confirmed: a grant published after
// it reaches this Locker (or later, when it was confirmed again after a
// break). The caller must call leave. join returns early with ctx's error
// when ctx ends first.
func (l *Locker) join(ctx context.Context, channel, owner string) (me *waiter, readyAt time.Time, leave func(), err error) {
	me = &waiter{owner: owner, wake: make(chan struct{}, 1)}
	l.mu.Lock()
	w := l.subscriptions[channel]
	if w == nil {
		var wctx context.Context
		wctx, stop := context.WithCancel(context.Background())
		w = &subscription{channel: channel, ready: make(chan struct{}), stop: stop}
		l.subscriptions[channel] = w
		go l.read(wctx, w)
	}
	me.sub = w
	w.waiters = append(w.waiters, me)
	delete(l.joining, owner)
	for i := range w.recent {
		if w.recent[i].owner == owner {
			me.grant, w.recent[i] = w.recent[i], grantMsg{}
			me.ring()
		}
	}
	l.mu.Unlock()
	leave = func() { l.leave(w, me) }

	select {
	case <-w.ready:
		err = w.readyErr
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		leave()
		return nil, time.Time{}, nil, err
	}
	readyAt = w.readyAt
	l.mu.Lock()
	if w.again.After(readyAt) {
		readyAt = w.again
	}
	l.mu.Unlock()
	return me, readyAt, leave, nil
}

func (w *subscription) setReady(err error) {
	w.readyOnce.Do(func() { w.readyErr, w.readyAt = err, time.Now(); close(w.ready) })
}

// leave unregisters a waiter. A wake-up it received but did not use passes
// to another waiter; a grant it did not use is the caller's to give back
// (withdraw). The last waiter ends the subscription. leave does not wait
// for the reader: on a server that hangs, closing the subscription can take
// as long as the client's read timeout, and the caller's deadline comes
// first.
func (l *Locker) leave(w *subscription, me *waiter) {
	l.mu.Lock()
	for i, c := range w.waiters {
		if c == me {
			w.waiters = append(w.waiters[:i], w.waiters[i+1:]...)
			break
		}
	}
	if me.tryNow {
		l.wakeOne(w)
	}
	var ps *redis.PubSub
	if len(w.waiters) == 0 && !w.closed {
		w.closed, ps = true, w.ps
		if l.subscriptions[w.channel] == w {
			delete(l.subscriptions, w.channel)
		}
	}
	last := w.closed
	l.mu.Unlock()
	if last {
		w.stop()
		if ps != nil {
			go func() { _ = ps.Close() }() // ends the reader's Receive
		}
	}
}

// drop takes a failed subscription out of Locker.subscriptions so that the next waiter
// subscribes afresh. Its present waiters get err.
func (l *Locker) drop(w *subscription, err error) {
	l.mu.Lock()
	if l.subscriptions[w.channel] == w {
		delete(l.subscriptions, w.channel)
	}
	l.mu.Unlock()
	w.setReady(err)
}

// wakeOne wakes the longest-waiting waiter that has no wake-up pending, so
// that local waiters get the lock in the order they came. l.mu is held.
func (l *Locker) wakeOne(w *subscription) {
	for _, c := range w.waiters {
		if !c.tryNow && c.grant.owner == "" {
			c.tryNow = true
			c.ring()
			return
		}
	}
}

// deliver hands a message on w's channel to its waiters: a grant to the
// waiter it names (kept for a while if none does: it may be about to
// join), anything else wakes one waiter to try. A grant for a shorter time
// than the other waiters' timers (to a waiter near the end of its budget,
// perhaps dead) moves their timers to its end, when they try again. A
// timer moved so follows the grants after it, to their ends even when
// later: the short grant was released and the lock granted on (whose
// release will be published too), and trying at the short grant's end
// would only find it held, every waiter at once. But never past the time
// the waiter's own try set (the holder's TTL then): a grant to another
// owner is signed with that owner's secret, which the waiter does not
// know, so anyone who may publish on the channel can send one, and a
// forged grant for a long time must not put the waiter to sleep past the
// moment a holder that died would have let the lock go.
func (l *Locker) deliver(w *subscription, msg string) {
	g, ok := parseGrant(msg)
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !ok {
		l.wakeOne(w)
		return
	}
	ends, found := now.Add(time.Duration(g.px)*time.Millisecond), false
	w.last = lastGrant{owner: g.owner, seen: now, ends: ends}
	for _, c := range w.waiters {
		switch {
		case c.owner == g.owner:
			c.grant, found = g, true
			c.ring()
		case !c.until.IsZero() && (c.until.After(ends) || c.byGrant):
			at := ends
			if !c.own.IsZero() && at.After(c.own) {
				at = c.own
			}
			c.until, c.retime, c.byGrant = at, at, true
			c.ring()
		}
	}
	if _, joining := l.joining[g.owner]; !found && joining {
		w.recent[w.recentNext] = g
		w.recentNext = (w.recentNext + 1) % len(w.recent)
	}
}

// expectJoin records that owner's Acquire may be queued by its tries and
// join a subscription later: a grant to it that comes first is kept.
func (l *Locker) expectJoin(owner string) {
	l.mu.Lock()
	l.joining[owner] = struct{}{}
	l.mu.Unlock()
}

// joined ends what expectJoin began, once owner has joined (join does this
// too) or its Acquire has returned.
func (l *Locker) joined(owner string) {
	l.mu.Lock()
	delete(l.joining, owner)
	l.mu.Unlock()
}

// wakeup is what rang a waiter: a grant for it (synced: covered by a
// release's WAIT), a request to try now, or a new time to try (see waiter).
// hold is set when a grant is held back (see taken): the waiter confirms
// it by a try once hold has passed, if no release's outcome rang it first.
type wakeup struct {
	grant  grantMsg
	synced bool
	tryNow bool
	retime time.Time
	hold   time.Duration
}

// taken returns what rang me and forgets it. A grant that needs
// confirming (needSync) is kept, not returned, while a release of this
// Locker that may have made it is covering it with WAIT: handed rings me
// again when it is done. It is held back for at most twice the sync
// timeout: a release that made it ran its script before the grant was
// published, and its WAIT ends within the timeout after that. A release
// in flight for longer (its request or reply stuck on the way, for as
// long as the client's timeouts) did not make it, or cannot tell in time.
func (l *Locker) taken(me *waiter, needSync bool) wakeup {
	l.mu.Lock()
	defer l.mu.Unlock()
	synced := me.grant.owner != "" && me.grant.token == me.synced
	if needSync && me.grant.owner != "" && !synced && me.sub.handing > 0 {
		now := time.Now()
		if me.heldSince.IsZero() {
			me.heldSince = now
		}
		hold := me.heldSince.Add(2 * l.sync.Timeout).Sub(now)
		if !me.until.IsZero() {
			hold = min(hold, me.until.Sub(now)) // not past the waiter's timer
		}
		if hold > 0 {
			u := wakeup{tryNow: me.tryNow, retime: me.retime, hold: hold}
			me.tryNow, me.retime = false, time.Time{}
			return u
		}
	}
	u := wakeup{me.grant, synced, me.tryNow, me.retime, 0}
	me.grant, me.tryNow, me.retime, me.heldSince = grantMsg{}, false, time.Time{}, time.Time{}
	return u
}

// coverable records me's lasting.
func (l *Locker) coverable(me *waiter, lasting time.Time) {
	l.mu.Lock()
	me.lasting = lasting
	l.mu.Unlock()
}

// handing counts a release of the lock on channel about to be sent with
// WAIT, and returns the subscription it counts on; nil when no Acquire of
// this Locker waits for the lock and could take a grant covered by the
// WAIT (then the release needs none).
func (l *Locker) handing(channel string) *subscription {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.subscriptions[channel]
	if w == nil {
		return nil
	}
	now := time.Now()
	for _, c := range w.waiters {
		if now.Before(c.lasting) {
			w.handing++
			return w
		}
	}
	return nil
}

// handed ends what handing began: when the release granted the lock to a
// waiter of w and its WAIT was acknowledged by enough replicas (synced),
// that waiter takes the grant without confirming it; once no release is
// in flight, waiters holding grants back (taken) go on, and confirm them.
func (l *Locker) handed(w *subscription, r released, synced bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w.handing--
	for _, c := range w.waiters {
		switch {
		case synced && c.owner == r.owner:
			c.synced = r.token
			c.ring()
		case w.handing == 0 && c.grant.owner != "":
			c.ring()
		}
	}
}

// setTimer records when me's timer fires (zero: none), at set from the
// reply of me's try that began at tried. A grant to another owner that
// reached the subscription after that try began, while me had no timer
// (its reply on the way, or before it joined), moved no timer of me's:
// the try may have run before the release that granted it, and its reply
// gives the old holder's TTL. The timer fires at that grant's end instead,
// if earlier (as deliver would have moved it), and me is rung to see it.
func (l *Locker) setTimer(me *waiter, at, tried time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	me.until, me.own, me.byGrant = at, at, false
	if g := me.sub.last; !at.IsZero() && g.owner != me.owner && g.seen.After(tried) && g.ends.Before(at) {
		me.until, me.retime, me.byGrant = g.ends, g.ends, true
		me.ring()
	}
}

// wakeAll wakes every waiter: messages may have been lost.
func (l *Locker) wakeAll(w *subscription) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.wakeAllLocked(w)
}

// subscribedAgain records that w was confirmed again after a break and
// wakes every waiter, in one step: a waiter that joins later learns of it
// from join's readyAt.
func (l *Locker) subscribedAgain(w *subscription) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w.again = time.Now()
	l.wakeAllLocked(w)
}

func (l *Locker) wakeAllLocked(w *subscription) {
	for _, c := range w.waiters {
		c.tryNow = true
		c.ring()
	}
}

// read subscribes and delivers the subscription's messages until the last
// waiter leaves. When the connection breaks after the subscription was
// confirmed, go-redis reconnects and resubscribes on the next receive;
// releases published meanwhile are lost, so every waiter is woken to look
// for itself. An error before the confirmation fails the subscription.
func (l *Locker) read(ctx context.Context, w *subscription) {
	if l.conn != nil {
		l.readConn(ctx, w)
		return
	}
	ps, err := l.subscribe(ctx, w)
	if err != nil {
		l.drop(w, err)
		return
	}

	failures, confirmed := 0, 0
	for {
		msg, err := ps.Receive(ctx)
		if (l.opaque || l.bothWays) && shardedRefused(err) {
			// SSUBSCRIBE refused, after SUBSCRIBE (confirmed first, on
			// the same connection): the subscription goes on with
			// SUBSCRIBE alone, as before both were sent, rather than
			// fail every wait (TestOpaqueClientWithoutShardedPubSub).
			// go-redis sends it again with every resubscription.
			w.kinds = 1
			if confirmed >= w.kinds {
				select {
				case <-w.ready:
				default:
					w.setReady(nil)
				}
			}
			continue
		}
		if err != nil {
			// A Ring closes the client of a shard that SetAddrs
			// replaced, and this subscription with it: subscribe again
			// through the Ring (below). Any other closed client is the
			// caller's, closed for good.
			closed := errors.Is(err, redis.ErrClosed)
			if ctx.Err() != nil || closed && !l.ringServes(w.channel) {
				l.drop(w, errors.Join(err, ctx.Err()))
				return
			}
			select {
			case <-w.ready:
			default: // not confirmed yet: fail it; waiters retry
				_ = ps.Close()
				l.drop(w, err)
				return
			}
			l.wakeAll(w)
			failures++
			if !pause.For(ctx, pause.Backoff(failures)) {
				l.drop(w, ctx.Err())
				return
			}
			if _, moved := redis.IsMovedError(err); moved || closed {
				// Subscribed where the slot was (or on a Ring shard's
				// client now closed): try where it is now.
				if ps, err = l.resubscribe(ctx, w, ps); err != nil {
					l.drop(w, err)
					return
				}
			}
			continue
		}
		failures = 0
		switch m := msg.(type) {
		case *redis.Subscription:
			switch m.Kind {
			case "subscribe", "ssubscribe":
				select {
				case <-w.ready:
					// Subscribed again after the connection broke (go-redis
					// resubscribes) or after a slot move: a release
					// published in between was lost, maybe after the
					// waiters' tries. Wake them all to look again, now
					// that releases reach us again.
					l.subscribedAgain(w)
				default:
					if confirmed++; confirmed >= w.kinds {
						w.setReady(nil)
					}
				}
			case "sunsubscribe":
				// Redis 7 drops a shard channel's subscribers when the
				// node loses the channel's slot (a migration or a
				// failover): subscribe where the slot is now.
				if ps, err = l.resubscribe(ctx, w, ps); err != nil {
					l.drop(w, err)
					return
				}
			}
		case *redis.Message:
			l.deliver(w, m.Payload)
		}
	}
}

// errWatchClosed ends a subscription whose last waiter left while it was
// being made.
var errWatchClosed = errors.New("redislock: no waiter left on the subscription")

// subscribe subscribes to w's channel and makes the subscription w's, unless
// the last waiter has left meanwhile. On a cluster the subscription goes to
// the node that owns the channel's slot.
func (l *Locker) subscribe(ctx context.Context, w *subscription) (*redis.PubSub, error) {
	var ps *redis.PubSub
	var err error
	if ring, ok := l.client.(*redis.Ring); ok {
		// On the client of the shard the Ring puts the channel on (as
		// Ring.Subscribe does, which panics when the Ring is closed or
		// has every shard marked down: here that is an error). It drops
		// the error of the subscription it sends: one that failed is
		// made again by the PubSub's next receive, and the waiters wait
		// for its confirmation within their budgets.
		var shard *redis.Client
		if shard, err = ring.GetShardClientForKey(w.channel); err == nil {
			ps = shard.Subscribe(ctx, w.channel)
		}
	} else if l.sharded && !l.bothWays {
		ps = l.client.SSubscribe(ctx)
		err = ps.SSubscribe(ctx, w.channel)
	} else if l.opaque || l.bothWays {
		ps, err = subscribeOpaque(ctx, l.client, w.channel)
		w.kinds = 2
	} else {
		ps = l.client.Subscribe(ctx)
		err = ps.Subscribe(ctx, w.channel)
	}
	l.mu.Lock()
	closed := w.closed
	if err == nil && !closed {
		w.ps = ps
	}
	l.mu.Unlock()
	if closed && err == nil {
		err = errWatchClosed
	}
	if err != nil {
		if ps != nil {
			_ = ps.Close()
		}
		return nil, errors.Join(err, ctx.Err())
	}
	return ps, nil
}

// shardedRefused reports a server's refusal of SSUBSCRIBE: an ACL user
// without it (NOPERM), or a server that does not know it (before Redis 7).
func shardedRefused(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.Contains(strings.ToLower(err.Error()), "ssubscribe")
}

// subscribeOpaque subscribes to channel through a client New cannot
// identify, both ways on one connection (the channel's slot's node when
// it is a cluster's): it may hide a cluster client, whose Lockers publish
// grants with SPUBLISH only, and this Locker's scripts publish both ways
// (publishMode) for them and for those that SUBSCRIBE. The channel is
// given to Subscribe itself: a Ring behind the client panics on a
// Subscribe without one (TestWaitOnInterfaceWrappedRing), and on one while
// it has every shard marked down, which is returned here as the error.
// Subscribe's own error comes with SSubscribe's, which uses its connection.
func subscribeOpaque(ctx context.Context, c redis.UniversalClient, channel string) (ps *redis.PubSub, err error) {
	defer func() {
		if r := recover(); r != nil {
			ps = nil
			if e, ok := r.(error); ok {
				err = e
			} else {
				err = fmt.Errorf("redislock: subscribe: %v", r)
			}
		}
	}()
	ps = c.Subscribe(ctx, channel)
	if err := ps.SSubscribe(ctx, channel); err != nil {
		_ = ps.Close()
		return nil, err
	}
	return ps, nil
}

// resubscribe replaces w's sharded subscription old with one on the node
// that owns the channel's slot now. It tries again, with back-off, until it
// succeeds or the last waiter leaves (ctx ends): the waiters joined this
// subscription and wait on it, so one given up here would never wake them
// again. The confirmation of the new subscription wakes them all (read).
func (l *Locker) resubscribe(ctx context.Context, w *subscription, old *redis.PubSub) (*redis.PubSub, error) {
	_ = old.Close()
	for failures := 1; ; failures++ {
		if cc, ok := l.client.(*redis.ClusterClient); ok {
			cc.ReloadState(ctx)
		}
		ps, err := l.subscribe(ctx, w)
		if err == nil || ctx.Err() != nil || errors.Is(err, errWatchClosed) {
			return ps, err
		}
		if !pause.For(ctx, pause.Backoff(failures)) {
			return nil, errors.Join(err, ctx.Err())
		}
	}
}
