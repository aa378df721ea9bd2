package fencerueidis

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/rueidis"
)

// TestResubscribeAfterUnsubscribe: on the shared connection of RESP2
// waiters, reader A of a channel leaves (its UNSUBSCRIBE goes out, since
// another channel keeps the connection up) as reader B of the same channel
// comes, 300 times. Once B is confirmed and A gone, the channel must be
// subscribed: the server must not get A's UNSUBSCRIBE after B's SUBSCRIBE,
// which ended B's subscription while B went on waiting for a release that
// never came. With B's wait for A's UNSUBSCRIBE removed, a PUBLISH then
// reached no one (rounds 64 and 93 of 300 in two runs: "0 receivers").
func TestResubscribeAfterUnsubscribe(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	cn := resp2Conn(t, srv.Addr)
	sub := func(ctx context.Context, channel string, ready func()) <-chan error {
		return subscribe(ctx, cn, channel, ready, func(string) {})
	}
	wait := func(what string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s not confirmed in 5 s", what)
		}
	}
	actx, stopAnchor := context.WithCancel(context.Background())
	anchored := make(chan struct{})
	anchor := sub(actx, "anchor", func() { close(anchored) })
	defer func() { stopAnchor(); <-anchor }()
	wait("anchor", anchored)
	for round := range 300 {
		actx, leaveA := context.WithCancel(context.Background())
		aReady := make(chan struct{})
		a := sub(actx, "churn", func() { close(aReady) })
		wait("A", aReady)
		bctx, leaveB := context.WithCancel(context.Background())
		bReady := make(chan struct{})
		b := sub(bctx, "churn", func() { close(bReady) })
		leaveA()
		<-a
		wait("B", bReady)
		n, err := admin.Publish(context.Background(), "churn", "released").Result()
		leaveB()
		<-b
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatalf("round %d: B confirmed and A gone, but a PUBLISH reached 0 receivers", round)
		}
	}
}

// resp2Conn returns the conn of an adapter on a client of addr that
// speaks RESP2, closed in t.Cleanup: its waiters share one dedicated
// subscription connection.
func resp2Conn(t *testing.T, addr string) conn {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, AlwaysRESP2: true, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return conn{c: c, unsub: &unsubs{m: make(map[string]chan struct{})}, subs: new(subscribers)}
}

// subscribe runs cn.subscribeDedicated in a goroutine of its own and
// returns a channel that gets its error once it returns.
func subscribe(ctx context.Context, cn conn, channel string, ready func(), message func(string)) <-chan error {
	done := make(chan error, 1)
	go func() { done <- cn.subscribeDedicated(ctx, channel, ready, message) }()
	return done
}
