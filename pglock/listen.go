package pglock

import (
	"context"
	"fmt"
)

// subscription is the Locker's one use of its Listener, shared by every
// Acquire of the Locker that waits, whatever the lock's name. It lives while
// someone waits: the last waiter to leave stops it. One whose listener
// stopped on its own (the connection failed) is taken out of Locker.sub at
// once and closes broken, so that its waiters join a new one.
type subscription struct {
	ready   chan struct{} // closed once Listen has returned; err is set before
	err     error
	broken  chan struct{} // closed when the listener has stopped
	stop    context.CancelFunc
	waiters map[*waiter]struct{} // guarded by Locker.mu
}

// waiter is one waiting Acquire: a notification with its lock's name sends
// on wake, which has room for one, so the reader never blocks.
type waiter struct {
	name string
	wake chan struct{}
}

// join registers a waiter for name, listening first if nobody in this
// Locker is, and returns once the server has confirmed the LISTEN, so that
// no release notified after join returns is missed. The caller must call
// leave.
func (l *Locker) join(ctx context.Context, name string) (*subscription, *waiter, error) {
	l.mu.Lock()
	s := l.sub
	if s == nil {
		lctx, stop := context.WithCancel(context.Background())
		s = &subscription{ready: make(chan struct{}), broken: make(chan struct{}), stop: stop, waiters: map[*waiter]struct{}{}}
		l.sub = s
		go l.read(lctx, s)
	}
	w := &waiter{name: name, wake: make(chan struct{}, 1)}
	s.waiters[w] = struct{}{}
	l.mu.Unlock()
	select {
	case <-s.ready:
	case <-ctx.Done():
		l.leave(s, w)
		return nil, nil, ctx.Err()
	}
	if s.err != nil {
		l.leave(s, w)
		return nil, nil, fmt.Errorf("pglock: listen: %w", s.err)
	}
	return s, w, nil
}

// leave unregisters w; the last waiter stops the subscription. It does not
// wait for the reader to end: a Listener that ignores its ctx (a Listen
// that never returns, a channel never closed) must not hold Acquire beyond
// its budget. The reader ends when the Listener lets go.
func (l *Locker) leave(s *subscription, w *waiter) {
	l.mu.Lock()
	delete(s.waiters, w)
	last := len(s.waiters) == 0
	if last && l.sub == s {
		l.sub = nil
	}
	l.mu.Unlock()
	if last {
		s.stop()
	}
}

// read listens and wakes the waiters of each name notified, until the
// listener stops.
func (l *Locker) read(ctx context.Context, s *subscription) {
	defer close(s.broken)
	defer func() {
		l.mu.Lock()
		if l.sub == s {
			l.sub = nil
		}
		l.mu.Unlock()
	}()
	ch, err := l.listener.Listen(ctx, l.table)
	s.err = err
	close(s.ready)
	if err != nil {
		return
	}
	if ch == nil {
		// A Listener that returned no channel and no error (a stub that
		// turns notifications off) delivers nothing and closes nothing:
		// ranging over it would block this goroutine for good, one per
		// wait. Its waiters wake at the holder's expiry, as without a
		// Listener; the subscription ends with its last waiter.
		<-ctx.Done()
		return
	}
	for name := range ch {
		l.mu.Lock()
		for w := range s.waiters {
			if w.name == name {
				select {
				case w.wake <- struct{}{}:
				default:
				}
			}
		}
		l.mu.Unlock()
	}
}
