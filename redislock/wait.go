package redislock

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// watch is one subscription to a lock's release channel, shared by every
// Acquire of this Locker that waits on that lock. A release message wakes
// one local waiter, not all of them: only one can win. The subscription
// lives while someone waits; the last waiter to leave closes it and waits
// for its reader goroutine to exit.
type watch struct {
	channel string
	ps      *redis.PubSub   // replaced by read when the server drops it; guarded by Locker.mu then
	waiters []chan struct{} // each waiter's wake-up, capacity 1, in arrival order; guarded by Locker.mu

	readyOnce sync.Once
	ready     chan struct{} // closed when the subscription is confirmed or failed
	readyErr  error
	readyAt   time.Time // when it was confirmed

	closing chan struct{}   // closed by the last waiter, before ps.Close
	ctx     context.Context // ended by the last waiter: bounds a resubscription
	stop    context.CancelFunc
	done    chan struct{} // closed when the reader goroutine has exited
}

// join registers a waiter on channel, subscribing if nobody local is
// subscribed yet, and returns once the server has confirmed the
// subscription, so that no release published after join returns is missed.
// readyAt is when the subscription was confirmed: a release published after
// it reaches this Locker. The caller must call leave.
func (l *Locker) join(ctx context.Context, channel string) (wake <-chan struct{}, readyAt time.Time, leave func(), err error) {
	me := make(chan struct{}, 1)
	l.mu.Lock()
	w := l.watches[channel]
	first := w == nil
	if first {
		w = &watch{channel: channel, ready: make(chan struct{}), closing: make(chan struct{}), done: make(chan struct{})}
		w.ctx, w.stop = context.WithCancel(context.Background())
		l.watches[channel] = w
	}
	w.waiters = append(w.waiters, me)
	l.mu.Unlock()
	leave = func() { l.leave(channel, w, me) }

	if first {
		// Subscribe before the reader starts: on a cluster the first
		// subscription picks the node that owns the channel's slot.
		if l.sharded {
			w.ps = l.client.SSubscribe(ctx)
			err = w.ps.SSubscribe(ctx, channel)
		} else {
			w.ps = l.client.Subscribe(ctx)
			err = w.ps.Subscribe(ctx, channel)
		}
		if err != nil {
			w.setReady(err)
			close(w.done)
		} else {
			go l.read(w)
		}
	}
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
	return me, w.readyAt, leave, nil
}

func (w *watch) setReady(err error) {
	w.readyOnce.Do(func() { w.readyErr, w.readyAt = err, time.Now(); close(w.ready) })
}

// leave unregisters a waiter. A wake-up it received but did not use passes
// to another waiter. The last waiter closes the subscription.
func (l *Locker) leave(channel string, w *watch, me chan struct{}) {
	l.mu.Lock()
	for i, c := range w.waiters {
		if c == me {
			w.waiters = append(w.waiters[:i], w.waiters[i+1:]...)
			break
		}
	}
	select {
	case <-me:
		l.wakeOne(w)
	default:
	}
	last := len(w.waiters) == 0
	if last {
		delete(l.watches, channel)
	}
	l.mu.Unlock()
	if last {
		close(w.closing)
		w.stop()
		l.mu.Lock()
		ps := w.ps
		l.mu.Unlock()
		if ps != nil {
			_ = ps.Close()
		}
		<-w.done
	}
}

// wakeOne wakes the longest-waiting waiter that has no wake-up pending, so
// that local waiters get the lock in the order they came. l.mu is held.
func (l *Locker) wakeOne(w *watch) {
	for _, c := range w.waiters {
		select {
		case c <- struct{}{}:
			return
		default:
		}
	}
}

// wakeAll wakes every waiter: messages may have been lost.
func (l *Locker) wakeAll(w *watch) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range w.waiters {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

// read delivers the subscription's messages until the last waiter closes it.
// When the connection breaks, go-redis reconnects and resubscribes on the
// next receive; releases published meanwhile are lost, so every waiter is
// woken to look for itself.
func (l *Locker) read(w *watch) {
	defer close(w.done)
	backoff := time.NewTimer(0)
	defer backoff.Stop()
	failures := 0
	moved := false // the subscription is being moved to the slot's new node
	for {
		msg, err := w.ps.Receive(context.Background())
		if err != nil {
			select {
			case <-w.closing:
				return
			default:
			}
			if errors.Is(err, redis.ErrClosed) {
				return
			}
			w.setReady(err)
			l.wakeAll(w)
			failures++
			backoff.Reset(min(time.Duration(failures)*10*time.Millisecond, time.Second))
			select {
			case <-w.closing:
				return
			case <-backoff.C:
			}
			if _, isMoved := redis.IsMovedError(err); isMoved {
				// Subscribed where the slot was: try where it is now.
				moved = true
				if !l.resubscribe(w) {
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
				w.setReady(nil)
				if moved {
					// Subscribed again after a move: wake every
					// waiter, since releases published meanwhile
					// reached nobody.
					moved = false
					l.wakeAll(w)
				}
			case "sunsubscribe":
				// Redis 7 drops a shard channel's subscribers when the
				// node loses the channel's slot (a migration or a
				// failover): subscribe where the slot is now.
				moved = true
				if !l.resubscribe(w) {
					return
				}
			}
		case *redis.Message:
			l.mu.Lock()
			l.wakeOne(w)
			l.mu.Unlock()
		}
	}
}

// resubscribe replaces w's sharded subscription with a new one on the node
// that owns the channel's slot now. It returns false when the last waiter
// has left meanwhile.
func (l *Locker) resubscribe(w *watch) bool {
	if cc, ok := l.client.(*redis.ClusterClient); ok {
		cc.ReloadState(w.ctx)
	}
	ps := l.client.SSubscribe(w.ctx, w.channel)
	l.mu.Lock()
	select {
	case <-w.closing:
		l.mu.Unlock()
		_ = ps.Close()
		return false
	default:
	}
	old := w.ps
	w.ps = ps
	l.mu.Unlock()
	_ = old.Close()
	return true
}
