package pglock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/pgtest"
)

// TestGrantSurvivesCrashUnderAsyncCommit: a server (or a role, or a
// database) with synchronous_commit = off, a common tuning (the test
// server runs so), acknowledges a commit before its WAL is on disk; a
// crash within the WAL writer's delay (200 ms by default, 3 times that at
// worst) loses it. A grant or a renewal so lost leaves the holder with a
// lease whose Deadline lies ahead and the row free (or expiring sooner)
// after the recovery: another Locker takes the lock inside the lease, two
// holders. The grant and the renewal must be durable when acknowledged,
// whatever the session's synchronous_commit (a release lost only keeps the
// lock held until its expiry, as a failed Release does).
//
// The crash is made deterministic (pgtest.CrashAfter): the WAL writer is
// stopped before the statement and killed after its reply, and the server
// recovers from the WAL on disk. The schema and the row are made durable
// first.
func TestGrantSurvivesCrashUnderAsyncCommit(t *testing.T) {
	for _, step := range []string{"acquire", "extend"} {
		t.Run(step, func(t *testing.T) {
			srv, err := pgtest.Launch()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(srv.Kill)
			d := newDatabase(t, srv)
			l := d.locker(t, d.db)
			var setting string
			if err := d.db.QueryRowContext(t.Context(), `SHOW synchronous_commit`).Scan(&setting); err != nil {
				t.Fatal(err)
			}
			if setting != "off" {
				t.Fatalf("the test server's synchronous_commit is %q, want off", setting)
			}
			ttl := time.Minute // acquire: the lease taken after the WAL writer stopped
			if step == "extend" {
				ttl = 3 * time.Second // extend: the lease taken before, extended after
			}
			lease, err := l.Acquire(ctxFor(t, 10*time.Second), "x", fence.TTL(ttl))
			if err != nil {
				t.Fatal(err)
			}
			if step == "acquire" {
				// The row exists, free: only the grant is at stake.
				if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
					t.Fatal(err)
				}
			}
			pgtest.CrashAfter(t, d.db, d.dsn, func() {
				switch step {
				case "acquire":
					if lease, err = l.Acquire(ctxFor(t, 10*time.Second), "x", fence.TTL(time.Minute)); err != nil {
						t.Fatal(err)
					}
				case "extend":
					if err := lease.Extend(ctxFor(t, 10*time.Second), time.Minute); err != nil {
						t.Fatal(err)
					}
				}
			})

			other := d.locker(t, open(t, d.dsn, nil))
			opts := []fence.Option{fence.TTL(time.Minute)}
			if step == "extend" {
				// The row's expiry before the renewal (3 s after the
				// grant) passes within the wait, if the renewal was lost.
				opts = append(opts, fence.Wait(5*time.Second))
			}
			second, err := other.Acquire(ctxFor(t, 20*time.Second), "x", opts...)
			if err == nil {
				t.Fatalf("two holders after a crash: the %s's lease (token %d) has %v left, another Locker got token %d",
					step, lease.Token(), time.Until(lease.Deadline()).Round(time.Millisecond), second.Token())
			}
			if !errors.Is(err, fence.ErrHeld) {
				t.Fatalf("the other Locker's Acquire: %v, want ErrHeld", err)
			}
			if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
				// Its pool's connection died in the crash (as in
				// TestReleaseAfterRestart): once more.
				t.Logf("first Release after the crash: %v", err)
				if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
					t.Fatalf("second Release after the crash: %v", err)
				}
			}
		})
	}
}
