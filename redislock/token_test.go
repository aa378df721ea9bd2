package redislock_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
)

// TestTokenRecordOutsideExactRange: a token record that Lua's doubles cannot
// increase exactly (2^53 + 1 reads as 2^53, and +1 rounds back; int64's
// maximum wraps negative) or that is not an integer at all is refused with
// ErrBadTokenRecord naming the key; nothing is locked and no token is handed
// out. The largest record that can be followed gives the exact next token.
func TestTokenRecordOutsideExactRange(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	l := newLocker(t, c)
	const name = "lock:payment:1001"
	record := lockKey(name) + ":token"
	for _, bad := range []string{"9007199254740993", "9007199254740992", "9007199254740991", "9223372036854775807", "abc", "", "-5", "0123", "12.0", "1e15", " 1"} {
		if err := c.Set(ctx(t), record, bad, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		for range 2 { // twice: the bug handed out one token twice
			lease, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute), fence.Wait(time.Second))
			if err == nil {
				_ = lease.Release(ctx(t))
				t.Fatalf("record %q: Acquire handed out token %d, want ErrBadTokenRecord", bad, lease.Token())
			}
			if !errors.Is(err, redislock.ErrBadTokenRecord) || !errors.Is(err, fence.ErrNotAcquired) || !strings.Contains(err.Error(), record) {
				t.Fatalf("record %q: Acquire = %v, want ErrNotAcquired and ErrBadTokenRecord naming %s", bad, err, record)
			}
		}
		if n := c.Exists(ctx(t), lockKey(name)).Val(); n != 0 {
			t.Fatalf("record %q: the refused acquisition left the lock held", bad)
		}
		if got := c.Get(ctx(t), record).Val(); got != bad {
			t.Fatalf("record %q was changed to %q", bad, got)
		}
	}
	for _, tc := range []struct {
		record string
		want   fence.Token
	}{
		{"9007199254740990", 9007199254740991}, // 2^53 - 2: its successor is the last exact one
		{"4503599627370497", 4503599627370498}, // odd, past 2^52: spacing is still 1
		{"0", 0},                               // the clock floor decides
	} {
		if err := c.Set(ctx(t), record, tc.record, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		lease := acquire(t, l, name, fence.TTL(time.Minute))
		if tc.want != 0 && lease.Token() != tc.want {
			t.Fatalf("record %s: token %d, want %d", tc.record, lease.Token(), tc.want)
		}
		if lease.Token() <= 0 {
			t.Fatalf("record %s: token %d", tc.record, lease.Token())
		}
		if got := c.Get(ctx(t), record).Val(); got != strings.TrimSpace(fmtToken(lease.Token())) {
			t.Fatalf("record after token %d is %q", lease.Token(), got)
		}
		if err := lease.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
}

func fmtToken(tok fence.Token) string { return strconv.FormatInt(int64(tok), 10) }

// TestTokenRecordRetention: the README says the last-token record expires
// after the retention period, at least the lease time, so that no key
// outlives its use, and that tokens still increase once it has expired (the
// clock floor); no test had let the record expire by itself (deleting it
// stood in). Each path that writes the record gives it the retention: a
// take, a grant on release to a waiter, and a take whose lease outlasts the
// retention, which keeps the record for the lease.
func TestTokenRecordRetention(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	const retention = 300 * time.Millisecond
	l := newLockerWith(t, c, redislock.Options{TokenRetention: retention})
	const name = "lock:payment:1001"
	record := lockKey(name) + ":token"
	wantPTTL := func(what string, low, high time.Duration) {
		t.Helper()
		if pttl := c.PTTL(ctx(t), record).Val(); pttl < low || pttl > high {
			t.Fatalf("%s: the token record's PTTL is %v, want %v to %v", what, pttl, low, high)
		}
	}

	first := acquire(t, l, name, fence.TTL(100*time.Millisecond))
	wantPTTL("after a take", 1, retention)
	// A waiter queued behind first gets the lock granted by first's
	// Release, which writes the record again.
	granted := make(chan fence.Lease, 1)
	go func() {
		lease, err := l.Acquire(ctx(t), name, fence.TTL(100*time.Millisecond), fence.Wait(10*time.Second))
		if err != nil {
			t.Error(err)
		}
		granted <- lease
	}()
	waitFor(t, func() bool { return c.Exists(ctx(t), lockKey(name)+":queue").Val() == 1 })
	// ErrLeaseLost: a loaded machine let first's 100 ms run out, and the
	// waiter took the lock by itself (the record written by a take again).
	if err := first.Release(ctx(t)); err != nil && !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatal(err)
	}
	second := <-granted
	if second == nil {
		t.FailNow()
	}
	wantPTTL("after a grant", 1, retention)
	if err := second.Release(ctx(t)); err != nil && !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return c.Exists(ctx(t), record).Val() == 0 })
	third := acquire(t, l, name, fence.TTL(time.Minute))
	if third.Token() <= second.Token() {
		t.Fatalf("token %d after the record expired, want > %d", third.Token(), second.Token())
	}
	wantPTTL("after a take of a minute's lease", 50*time.Second, time.Minute)
}
