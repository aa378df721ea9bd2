package fencerueidis

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/redistest"
)

// TestStaleSubscribeReplyConfirms: on the shared connection of RESP2
// waiters, reader A's SUBSCRIBE reaches the server, A leaves before its
// reply is read (its Acquire's budget ended), so its UNSUBSCRIBE follows,
// and reader B of the same channel comes while both replies are still
// unread. B must be told ready only once the channel is subscribed for
// it: a release published after B's ready is one B's waiter relies on.
// The connection's reading is held (an anchor reader's message callback
// blocks) so that the replies arrive after B joined, as they do on a
// loaded machine.
//
// It failed: A's reply confirmed B, whose ready then found the channel
// already unsubscribed by A's UNSUBSCRIBE ("PUBLISH at B's ready reached
// 0 receivers"); B's own SUBSCRIBE, sent next, was not confirmed to it
// again, so a release published in between was lost to B's waiter.
func TestStaleSubscribeReplyConfirms(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	cn := resp2Conn(t, srv.Addr)
	// until polls cond, a state of the server or of the adapter, with a
	// deadline well inside A's 2 s UNSUBSCRIBE timeout.
	until := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 1 s", what)
			}
			time.Sleep(2 * time.Millisecond) // polling with a deadline
		}
	}
	numsub := func(channel string) int64 { return admin.PubSubNumSub(context.Background(), channel).Val()[channel] }

	held, hold := make(chan struct{}), make(chan struct{})
	anchored := make(chan struct{})
	actx, stopAnchor := context.WithCancel(context.Background())
	anchor := subscribe(actx, cn, "anchor", func() { close(anchored) }, func(p string) {
		if p == "hold" {
			close(held)
			<-hold
		}
	})
	defer func() { stopAnchor(); <-anchor }()
	select {
	case <-anchored:
	case <-time.After(5 * time.Second):
		t.Fatal("anchor not confirmed in 5 s")
	}
	if err := admin.Publish(context.Background(), "anchor", "hold").Err(); err != nil {
		t.Fatal(err)
	}
	<-held
	released := false
	release := func() {
		if !released {
			released = true
			close(hold)
		}
	}
	defer release()

	actxA, leaveA := context.WithCancel(context.Background())
	a := subscribe(actxA, cn, "churn", func() {}, func(string) {})
	until("A's SUBSCRIBE on the server", func() bool { return numsub("churn") == 1 })
	leaveA()
	until("A's UNSUBSCRIBE on the server", func() bool { return numsub("churn") == 0 })

	atReady := make(chan int64, 1)
	got := make(chan string, 1)
	bctx, leaveB := context.WithCancel(context.Background())
	b := subscribe(bctx, cn, "churn", func() {
		atReady <- admin.Publish(context.Background(), "churn", "released").Val()
	}, func(p string) { got <- p })
	until("B joined", func() bool {
		cn.subs.mu.Lock()
		defer cn.subs.mu.Unlock()
		return cn.subs.cur != nil && len(cn.subs.cur.readers["churn"]) == 1
	})
	release()
	select {
	case n := <-atReady:
		if n == 0 {
			t.Errorf("PUBLISH at B's ready reached 0 receivers: B was told ready on A's reply, with A's UNSUBSCRIBE after it")
		} else {
			select {
			case <-got:
			case <-time.After(5 * time.Second):
				t.Errorf("the release published at B's ready was not delivered in 5 s")
			}
		}
	case <-time.After(5 * time.Second):
		t.Errorf("B not confirmed in 5 s")
	}
	leaveB()
	<-b
	<-a
}
