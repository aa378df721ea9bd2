package observetest

import (
	"context"
	"testing"

	"github.com/fencekit/fence"
)

// AcquireReleaseNoPanic acquires a lock with l and releases it, failing t
// if either call panics (inside an Observer: a metrics mistake must not
// crash the lock path) or returns an error; what names the Observer in the
// failure.
func AcquireReleaseNoPanic(t testing.TB, l fence.Locker, what string) {
	t.Helper()
	var lease fence.Lease
	err := noPanic(t, "Acquire", what, func() (err error) {
		lease, err = l.Acquire(context.Background(), "job")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := noPanic(t, "Release", what, func() error { return lease.Release(context.Background()) }); err != nil {
		t.Fatal(err)
	}
}

func noPanic(t testing.TB, call, what string, f func() error) error {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("%s with %s panicked: %v", call, what, p)
		}
	}()
	return f()
}
