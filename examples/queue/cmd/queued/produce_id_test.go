package main

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/examples/queue"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/internal/testmain"
)

func TestMain(m *testing.M) { testmain.Run(m, nil) }

// -id gives the produced message the caller's id (queue.ProduceID), so
// that running the command again after an error applies it once; an id
// ProduceID refuses is refused with queue.ErrInvalidID and nothing is
// appended; -id with -produce above 1 is a usage error.
func TestProduceWithID(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := "redis://" + srv.Addr
	args := func(extra ...string) []string {
		return append([]string{"-redis", url, "-stream", "idjobs"}, extra...)
	}
	for range 2 { // the caller's retry: two entries, one message id
		cfg, err := parseFlags(args("-id", "order-17"), func(string) string { return "" }, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if err := run(cfg, ""); err != nil {
			t.Fatal(err)
		}
	}
	entries, err := rdb.XRange(ctx, "idjobs", "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 {
		t.Fatalf("%d entries, want 2", len(entries))
	}
	for _, e := range entries {
		if e.Values[queue.IDField] != "order-17" {
			t.Errorf("entry %s: %q, want %s order-17", e.ID, e.Values, queue.IDField)
		}
	}

	for _, bad := range []string{"17-3", "a{b}", "x\x00y", "tab\there", strings.Repeat("x", queue.MaxIDLen+1), "\xff"} {
		cfg, err := parseFlags(args("-id", bad), func(string) string { return "" }, io.Discard)
		if err != nil {
			t.Fatalf("-id %q: %v", bad, err)
		}
		if err := run(cfg, ""); !errors.Is(err, queue.ErrInvalidID) {
			t.Errorf("-id %q: %v, want queue.ErrInvalidID", bad, err)
		}
	}
	if n, err := rdb.XLen(ctx, "idjobs").Result(); err != nil || n != 2 {
		t.Fatalf("after the refused ids the stream holds %d entries (%v), want 2", n, err)
	}
	if _, err := parseFlags(args("-id", "order-18", "-produce", "3"), func(string) string { return "" }, io.Discard); err == nil {
		t.Error("-id with -produce 3 accepted")
	}
}
