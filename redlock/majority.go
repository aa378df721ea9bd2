package redlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencekit/fence"
)

// An acquisition is decided as soon as its outcome is known, not when the
// slowest node has answered: once a majority has granted the lock, or once
// so many nodes refused (held by another owner, an error) that a majority
// can no longer grant it. Its latency is then the majority-th fastest
// node's, where waiting for every reply (as Redlock is usually written)
// makes it the slowest node's, up to the node timeout for a node that is
// down or hung.
//
// Deciding early is sound. The lease's token is the largest over the nodes
// that granted it by the time of the decision, a majority, and it is
// written back to those of them that answered a smaller one before Acquire
// returns, exactly as when every reply is awaited: every later majority
// shares a node with that one, which issues a greater token. A node whose
// reply comes later adds nothing to that argument and takes nothing from
// it: its record may hold a smaller token (no majority is made of it
// alone) or a greater one (later tokens are then only greater). The lease's
// validity is counted, as before, from before the first request was sent
// to after the write-back.
//
// The late replies are still read. A late refusal or error changes
// nothing. A late grant belongs to the try's owner: while the lease is held
// it joins the lease (Extend then renews it on that node, Release deletes
// it there without a revocation mark), and once the lease is released or
// has ended, or the try failed, the request that brought it gives it back
// at once. That last case is the race to close: a node that answers after
// Release (or after a failed Acquire) must not keep the lock for its lease
// time. Release, and the release of a failed try, already revoke the try on
// every node that had not answered, so the node refuses it if it runs it
// after them, and deletes it if before; giving back the late grant on top
// covers a release that could not reach the node, without waiting for its
// retries in the background.

// tryPhase is what has become of a try, for its late replies.
type tryPhase uint8

const (
	// deciding: the try's outcome is not settled; replies are kept.
	deciding tryPhase = iota
	// leased: the try became a lease; a late grant joins it.
	leased
	// abandoned: the try failed, or its lease was released; a late
	// grant is given back.
	abandoned
)

// errUndecided is the error of a node that had not answered when the try's
// outcome was known.
var errUndecided = errors.New("no reply when the outcome was known")

// tryFanout is one try's acquisition requests, sent to every node at once,
// and their replies, the late ones too.
type tryFanout struct {
	l       *Locker
	k       keys
	owner   string
	ttl     time.Duration
	timeout time.Duration
	acqKeys []string // {lock, token record, revocation mark}: shared, read only
	ownArg  []any    // {owner}: the release script's arguments, shared, read only
	// resent is set once a request took long enough for its client to
	// have sent it again (resend.After), or found the lock its own there
	// (go-redis did send it again): a copy may still run on that node
	// after the lock is given back, and take it for its lease time, for
	// nobody. Every release of this owner then leaves the revocation
	// mark, which refuses such a copy (relKeys).
	resent atomic.Bool

	cctx   context.Context    // the requests' context: the node timeout, not the caller's cancellation
	cancel context.CancelFunc // called by the last reply
	wake   chan struct{}      // closed once the outcome is known, or every node answered

	mu      sync.Mutex
	rs      []result // by node; got once its reply came
	left    int      // requests not answered yet
	grants  int      // replies that granted the lock
	refused int      // replies that did not (held, errors)
	woke    bool
	phase   tryPhase
	ls      *lease // when leased
	// Once the lease is released: covered if its release reached every
	// node, otherwise uncovered lists those it did not reach.
	covered   bool
	uncovered []bool
}

// isGrant tells whether an acquire script's reply took the lock.
func isGrant(res []int64) bool { return len(res) == 3 && res[0] == 1 && res[1] > 0 }

// isOwn tells whether an acquire script's reply found the lock taken by
// this very try already (acquire.lua's -3): not a grant, but the try's to
// give back.
func isOwn(res []int64) bool { return len(res) == 2 && res[0] == 0 && res[1] == -3 }

// errRanTwice is the error of a node that found the lock its try's
// already: go-redis sent the try again after its reply was lost, or
// another client given to New reaches the same server. It is not counted
// as a grant (one server would count twice towards a majority); the lock
// is given back if the try fails.
var errRanTwice = errors.New("the lock is this try's already: the request ran twice there (a client retry, or two clients of one server)")

// send sends the acquire script to every node at once, each request bounded
// by timeout. The requests do not end with ctx: one still out when the try
// is decided is answered, and its reply read, whatever the caller does with
// its context afterwards (cancelling a go-redis request mid-way would cost
// its connection, and tell nothing of whether the node ran it).
func (l *Locker) send(ctx context.Context, k keys, owner string, ttl, timeout time.Duration, acqKeys []string, acqArgs []any) *tryFanout {
	n := len(l.nodes)
	f := &tryFanout{l: l, k: k, owner: owner, ttl: ttl, timeout: timeout, acqKeys: acqKeys, ownArg: acqArgs[:1],
		wake: make(chan struct{}), rs: make([]result, n), left: n}
	f.cctx, f.cancel = context.WithTimeout(context.WithoutCancel(ctx), timeout)
	// A request still out when the try is decided is background work: it
	// gives back a grant that comes after the try failed or its lease was
	// released; Close waits for it.
	l.bg.addAll(n)
	for i := range n {
		l.spawn(func() {
			defer l.bg.done(i)
			if of := l.aliasOf[i].Load(); of != 0 {
				f.reply(i, nil, &AliasError{Node: i, Of: int(of) - 1})
				return
			}
			began := time.Now()
			res, err := acquireScript.Run(f.cctx, l.nodes[i], acqKeys, acqArgs...).Int64Slice()
			if after := l.resendAfter[i]; after > 0 && time.Since(began) >= after {
				f.resent.Store(true) // before the reply can decide the try
			}
			f.reply(i, res, err)
		})
	}
	return f
}

// reply records node i's reply, wakes the caller when it decides the try,
// and deals with a grant that comes after the try was decided.
func (f *tryFanout) reply(i int, res []int64, err error) {
	r := result{res: res, err: err, at: time.Now(), got: true}
	grant := err == nil && isGrant(res)
	own := err == nil && isOwn(res) // the try's lock, not a grant
	if own {
		f.resent.Store(true)
	}
	q, n := f.l.quorum, len(f.l.nodes)
	f.mu.Lock()
	f.rs[i] = r
	f.left--
	if grant {
		f.grants++
	} else {
		f.refused++
	}
	if !f.woke && (f.grants >= q || n-f.refused < q || f.left == 0) {
		f.woke = true
		close(f.wake)
	}
	phase, ls, last := f.phase, f.ls, f.left == 0
	// A late grant of a lease (joined, or given back) is told the lease's
	// token first, if it issued a smaller one: see writeBack.
	behind := grant && ls != nil && r.res[1] < int64(ls.token)
	if phase == abandoned && (f.covered || f.uncovered != nil && !f.uncovered[i]) {
		grant, own = false, false // the lease's release covered this node
	}
	f.mu.Unlock()
	if last {
		f.cancel()
	}
	if behind {
		f.writeBack(i, ls.token)
	}
	if own && phase == abandoned {
		// The try's lock, read after the try failed or its lease was
		// released: given back, as a grant would be. (Read while
		// deciding, the try's outcome reads it; while leased, Release
		// deletes it, the node counted as not granted.)
		var token fence.Token
		if ls != nil {
			token = ls.token
		}
		f.giveBack(i, token)
	}
	if !grant {
		return
	}
	switch phase {
	case deciding:
		// Kept in f.rs: the try's outcome (hand or abandon) reads it.
	case leased:
		if ls.join(i, r) {
			return
		}
		// The lease has ended: nobody will release this node for it.
		fallthrough
	case abandoned:
		var token fence.Token
		if ls != nil {
			token = ls.token
		}
		f.giveBack(i, token)
	}
}

// await runs pause, if any, then waits until the try is decided, the node
// timeout has passed or ctx has ended, and returns the replies come so far,
// by node, with the errors of those that have not come.
func (f *tryFanout) await(ctx context.Context, pause func()) []result {
	if pause != nil {
		pause()
	}
	decided := false
	select {
	case <-f.wake:
		decided = true
	case <-f.cctx.Done():
	case <-ctx.Done():
	}
	f.mu.Lock()
	out := slices.Clone(f.rs)
	f.mu.Unlock()
	for i := range out {
		switch err := out[i].err; {
		case ctx.Err() != nil && (!out[i].got || err != nil):
			// The caller's context ended the call.
			out[i].err = fmt.Errorf("node %d: %w", i, ctx.Err())
		case !out[i].got && decided:
			out[i].err = fmt.Errorf("node %d: %w", i, errUndecided)
		case !out[i].got || errors.Is(err, context.DeadlineExceeded):
			out[i].err = fmt.Errorf("node %d: %w within %v", i, errNoReply, f.timeout)
		case err != nil:
			out[i].err = fmt.Errorf("node %d: %w", i, nodeError(err))
		}
	}
	return out
}

// hand makes ls, built from the replies seen, the try's lease: the grants
// that came since join it, and later ones will.
func (f *tryFanout) hand(ls *lease, seen []result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.phase, f.ls = leased, ls
	for i, r := range f.rs {
		if !r.got || seen[i].got || r.err != nil || !isGrant(r.res) {
			continue
		}
		if r.res[1] < int64(ls.token) {
			// Told the lease's token before it joins (writeBack); until
			// then, Release revokes it as a node whose grant has not come.
			f.l.bg.add(i)
			go func() {
				defer f.l.bg.done(i)
				f.writeBack(i, ls.token)
				if !ls.join(i, r) {
					f.giveBack(i, ls.token)
				}
			}()
			continue
		}
		if !ls.join(i, r) {
			// The lease has ended already (its deadline passed).
			f.l.bg.add(i)
			go func() {
				defer f.l.bg.done(i)
				f.giveBack(i, ls.token)
			}()
		}
	}
}

// writeBack raises node i's last-token record to the lease's token, within
// the node timeout, before the node's late grant joins the lease or is
// given back. The lease's token is written back before Acquire returns only
// to the majority that decided it; a node that granted later issued its own
// token, possibly smaller. Left so, a later majority made of that node and
// one of the deciding majority that lost its record (restarted without
// persistence, with the clocks set back) would issue a token smaller than
// the lease's: with the write-back here, every node that granted the lease
// holds its token, as when every reply was awaited.
func (f *tryFanout) writeBack(i int, token fence.Token) {
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	_ = maxScript.Run(ctx, f.l.nodes[i], []string{f.k.token, f.k.lock}, int64(token), f.owner).Err()
}

// release marks the try's lease released, rs being the replies to the
// release sent to every node: a grant read from now on is given back by the
// request that brings it, on a node that did not answer that release. A
// node that did needs nothing more: the release ran there after the
// acquisition, and deleted it, or before it, and revoked it (the grant,
// read late, was then refused there).
func (f *tryFanout) release(rs []result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.phase = abandoned
	for i, r := range rs {
		if r.err != nil {
			if f.uncovered == nil {
				f.uncovered = make([]bool, len(rs))
			}
			f.uncovered[i] = true
		}
	}
	f.covered = f.uncovered == nil
}

// abandon marks the try failed: a grant read from now on is given back by
// the request that brings it. It returns the replies come so far, by node,
// a node that has not answered with an error.
func (f *tryFanout) abandon() []result {
	f.mu.Lock()
	f.phase = abandoned
	out := slices.Clone(f.rs)
	f.mu.Unlock()
	for i := range out {
		if !out[i].got {
			out[i].err = fmt.Errorf("node %d: %w", i, errUndecided)
		}
	}
	return out
}

// giveBack deletes, on node i, the lock this try took there after it had
// been given up on, within the node timeout; if the node does not answer,
// the release (with the revocation mark, and token, the lease's if the try
// became one, for the record) is retried in the background.
func (f *tryFanout) giveBack(i int, token fence.Token) {
	l := f.l
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	keys, args := f.relKeys()
	err := releaseScript.Run(ctx, l.nodes[i], keys, args...).Err()
	cancel()
	if err != nil {
		l.retryRelease(err, i, f.k, f.owner, f.acqKeys[2], f.ttl, int64(token))
	}
}

// relKeys returns the release script's keys and arguments for this try's
// lock: {lock} and {owner}, or, once a request may have been sent twice
// (resent), the revocation mark's too, which outlives the lock as long as
// a try given up on is revoked (revokeFor, or the lease time if longer).
func (f *tryFanout) relKeys() ([]string, []any) {
	if f.resent.Load() {
		return []string{f.acqKeys[0], f.acqKeys[2]}, []any{f.owner, max(f.ttl, revokeFor).Milliseconds()}
	}
	return f.acqKeys[:1], f.ownArg
}

// join takes node i's late grant, r, into the lease: Release deletes it
// there without a revocation mark, and renewals move it, knowing the
// node's clock. It returns false, taking nothing, if the lease has ended.
func (ls *lease) join(i int, r result) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.expiredLocked()
	if ls.err != nil {
		return false
	}
	ls.ungranted[i] = false
	if r.at.After(ls.refs[i].at) {
		ls.refs[i] = clockRef{nodeMs: r.res[2], at: r.at}
	}
	return true
}
