package fencerueidis

import (
	"context"
	"errors"
	"sync"

	"github.com/fencekit/fence/internal/redisconn"
	"github.com/redis/rueidis"
)

// subscribers is an adapter's shared subscription connection, for the
// clients whose waiters subscribe on a dedicated connection of the primary
// (see subscribeDedicated). rueidis's Dedicate takes that connection from
// its blocking pool, where replica sync's script and WAIT pairs also run:
// one per lock name waited on, as it was, BlockingPoolSize names waited on
// at once stalled every synced Acquire and renewal of other names until a
// waiter left (TestWaitersSpareBlockingPool). Every waited channel is
// subscribed on one connection instead, which is closed when its last
// reader leaves (rueidis does not close a dedicated connection with its
// client, so a connection kept for the adapter's life would outlive it).
type subscribers struct {
	mu  sync.Mutex
	cur *subscriber // the connection new readers join; nil when none
}

// subscriber is one shared subscription connection and its readers.
type subscriber struct {
	subs *subscribers
	up   chan struct{} // closed once dc is set
	dc   rueidis.DedicatedClient
	quit chan struct{} // closed when the last reader left: run closes the connection
	dead chan struct{} // closed when the connection ended
	err  error         // why it ended, set before dead is closed

	// Under subs.mu:
	readers map[string]map[*reader]bool // by channel; true once confirmed
	n       int                         // readers over all channels
	sent    map[string]bool             // channels a SUBSCRIBE was sent for, since the last UNSUBSCRIBE
	// unsubs are the channels whose UNSUBSCRIBE is under way, closed when
	// it is done: a reader of one waits for it before its SUBSCRIBE, so
	// that the server does not get the UNSUBSCRIBE after the SUBSCRIBE
	// and end the new reader's subscription.
	unsubs map[string]chan struct{}
}

// reader is one Subscribe on the shared connection.
type reader struct {
	ready   func()
	message func(string)
}

// join returns the current connection, started if there is none, with r
// as a reader of channel; it is not subscribed yet (see subscribe).
func (ss *subscribers) join(c conn, channel string, r *reader) *subscriber {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.cur
	if s == nil {
		s = &subscriber{subs: ss, up: make(chan struct{}), quit: make(chan struct{}), dead: make(chan struct{}),
			readers: make(map[string]map[*reader]bool), sent: make(map[string]bool), unsubs: make(map[string]chan struct{})}
		ss.cur = s
		go s.run(c)
	}
	if s.readers[channel] == nil {
		s.readers[channel] = make(map[*reader]bool)
	}
	s.readers[channel][r] = false
	s.n++
	return s
}

// run dedicates the connection, delivers its messages through the hooks,
// and closes it when the last reader leaves, when it dies (its readers end
// with the reason, and subscribe again on a new one), or when the client
// is closed (see watchClose).
func (s *subscriber) run(c conn) {
	dc, _ := c.c.Dedicate() // Close gives the slot back
	ended := dc.SetPubSubHooks(rueidis.PubSubHooks{OnMessage: s.onMessage, OnSubscription: s.onSubscription})
	s.dc = dc
	close(s.up)
	wctx, stopWatch := context.WithCancel(context.Background())
	closed := c.watchClose(wctx)
	var err error
	for done := false; !done; {
		select {
		case err = <-ended:
			if err == nil {
				err = redisconn.ErrUnsubscribed
			}
			done = true
		case err = <-closed: // the client was closed
			closed, done = nil, true
		case <-s.quit:
			done = true
		}
	}
	s.subs.mu.Lock()
	if s.subs.cur == s {
		s.subs.cur = nil
	}
	s.subs.mu.Unlock()
	s.err = err
	close(s.dead)
	dc.Close() // never back to the pool subscribed
	stopWatch()
	if closed != nil {
		<-closed
	}
}

// onMessage passes m to the confirmed readers of its channel, on the
// connection's goroutine.
func (s *subscriber) onMessage(m rueidis.PubSubMessage) {
	s.subs.mu.Lock()
	var to []*reader
	for r, confirmed := range s.readers[m.Channel] {
		if confirmed {
			to = append(to, r)
		}
	}
	s.subs.mu.Unlock()
	for _, r := range to {
		r.message(m.Message)
	}
}

// onSubscription confirms the readers of a subscribed channel: each is
// told once, after which it gets the channel's messages. A reply read
// while an UNSUBSCRIBE of the channel is under way answers a SUBSCRIBE
// sent before it (a reader's SUBSCRIBE waits for it), which it ends: it
// confirmed a reader that came meanwhile, told ready on a channel about to
// be unsubscribed, and not told again on its own SUBSCRIBE's reply, so a
// release published in between was lost (TestStaleSubscribeReplyConfirms).
func (s *subscriber) onSubscription(sub rueidis.PubSubSubscription) {
	if sub.Kind != "subscribe" {
		return
	}
	s.subs.mu.Lock()
	if s.unsubs[sub.Channel] != nil {
		s.subs.mu.Unlock()
		return
	}
	var to []*reader
	for r, confirmed := range s.readers[sub.Channel] {
		if !confirmed {
			s.readers[sub.Channel][r] = true
			to = append(to, r)
		}
	}
	s.subs.mu.Unlock()
	for _, r := range to {
		r.ready()
	}
}

// subscribe sends SUBSCRIBE channel, once the connection is up and no
// UNSUBSCRIBE of channel is under way (a channel already subscribed is
// confirmed again). A failure other than the server's reply leaves the
// connection in doubt, so it is closed: its readers subscribe again on a
// new one. When ctx ends during the call, rueidis still sends the
// SUBSCRIBE it queued, before the UNSUBSCRIBE of leave. A reader that
// joined as the connection died, or as the adapter closed it, finds it
// closed (ErrDedicatedClientRecycled, or ErrClosing while it closes): that
// is no lasting failure, and redislock, which does not retry rueidis's
// errors, failed the wait with it (TestFloodOfWaitedNames, resp2-killed);
// it subscribes again on ErrUnsubscribed. (A closed client is told apart
// by Subscribe, from the client's flag.)
func (s *subscriber) subscribe(ctx context.Context, channel string) error {
	select {
	case <-s.up:
	case <-ctx.Done():
		return ctx.Err()
	}
	s.subs.mu.Lock()
	unsub := s.unsubs[channel]
	s.subs.mu.Unlock()
	if unsub != nil {
		select {
		case <-unsub:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.subs.mu.Lock()
	s.sent[channel] = true
	s.subs.mu.Unlock()
	err := s.dc.Do(ctx, s.dc.B().Subscribe().Channel(channel).Build()).Error()
	if _, refused := rueidis.IsRedisErr(err); err != nil && !refused && ctx.Err() == nil {
		s.dc.Close()
		if errors.Is(err, rueidis.ErrDedicatedClientRecycled) || errors.Is(err, rueidis.ErrClosing) {
			return redisconn.ErrUnsubscribed
		}
	}
	return err
}

// leave removes r from channel's readers, unsubscribes the channel if it
// was the last, and has the connection closed if it was the last of all.
// rueidis (v1.0.79) does not unsubscribe a channel by itself: without it
// every channel waited on stayed subscribed, and its releases delivered,
// for the connection's life (TestSubscriptionsEndWithWaiters).
func (s *subscriber) leave(channel string, r *reader) {
	s.subs.mu.Lock()
	delete(s.readers[channel], r)
	s.n--
	if s.n == 0 {
		// Closing the connection ends its subscriptions.
		close(s.quit)
		if s.subs.cur == s {
			s.subs.cur = nil // a reader that comes next starts a new one
		}
		s.subs.mu.Unlock()
		return
	}
	if len(s.readers[channel]) > 0 {
		s.subs.mu.Unlock()
		return
	}
	delete(s.readers, channel)
	sent := s.sent[channel]
	delete(s.sent, channel)
	select {
	case <-s.dead:
		sent = false // nothing left to end
	default:
	}
	if !sent {
		s.subs.mu.Unlock()
		return
	}
	done := make(chan struct{})
	s.unsubs[channel] = done
	s.subs.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), unsubscribeTimeout)
	if err := s.dc.Do(ctx, s.dc.B().Unsubscribe().Channel(channel).Build()).Error(); err != nil {
		// Dead, or hung: closed rather than left subscribed.
		s.dc.Close()
	}
	cancel()
	s.subs.mu.Lock()
	delete(s.unsubs, channel)
	s.subs.mu.Unlock()
	close(done)
}
