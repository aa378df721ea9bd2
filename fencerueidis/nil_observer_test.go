package fencerueidis_test

import (
	"errors"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fencerueidis"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
)

// nilObserver is an Observer given as a nil pointer: the nil
// *fenceprom.Observer of a fenceprom.New whose error was ignored is the
// same.
type nilObserver struct{ fence.NopObserver }

// TestNilObserverRefused: New refuses an Observer holding a nil pointer
// (fence.ValidateObserver, in redislock's constructor, which the adapter
// goes through), rather than the first Acquire panicking in AcquireDone.
func TestNilObserverRefused(t *testing.T) {
	c := client(t, redistest.Start(t).Addr)
	var obs *nilObserver
	if _, err := fencerueidis.New(c, &redislock.Options{Observer: obs}); !errors.Is(err, fence.ErrInvalidOption) {
		t.Fatalf("New with a nil *nilObserver = %v; want ErrInvalidOption", err)
	}
	if _, err := fencerueidis.New(c, &redislock.Options{Observer: &nilObserver{}}); err != nil {
		t.Fatalf("New with an Observer = %v", err)
	}
}
