package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
)

// fence.Lead on a Locker whose client the user closed: no campaign can
// ever succeed again (every call fails at once, see TestClosedClientNoHang),
// so Lead must stop campaigning and return an error matching
// fence.ErrClosed, as it does for a closed redlock Locker, instead of
// campaigning, with a back-off, for as long as its ctx lasts (for ever, with
// a ctx that never ends: a goroutine that never returns).
func TestLeadStopsOnClosedClient(t *testing.T) {
	c := newClient(t, shared.Endpoints(), nil)
	l, err := etcdlock.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	elected := make(chan fence.Lease, 1)
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		done <- fence.Lead(ctx, l, t.Name(), func(ctx context.Context, lease fence.Lease) error {
			select {
			case elected <- lease:
			default:
			}
			<-ctx.Done()
			return nil
		}, fence.Backoff(10*time.Millisecond, 100*time.Millisecond))
	}()
	var lease fence.Lease
	select {
	case lease = <-elected:
	case err := <-done:
		t.Fatalf("Lead = %v before it was elected", err)
	case <-time.After(10 * time.Second):
		t.Fatal("not elected within 10 s")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	waitDone(t, lease, 5*time.Second)
	select {
	case err := <-done:
		t.Logf("Lead on a closed client: %v", err)
		if !errors.Is(err, fence.ErrClosed) {
			t.Fatalf("Lead on a closed client = %v, want an error matching fence.ErrClosed", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Lead on a closed client still campaigning 15 s later, its ctx never ending")
	}
}
