package doctor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/cmd/fence/internal/doctor"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestRenameDenied: since 274769f a lease's Release renames the lock to
// its released-by record (release.lua), and an ACL user denied RENAME
// releases without the record (the script deletes the lock instead), so
// that a Release sent again after its reply was lost reports the lease
// lost. The doctor did not ask ACL DRYRUN about RENAME and reported
// nothing for that user (run before: "no warning finding
// \"rename-denied\""); it now warns, and does not call the user's
// locking broken (no command-denied: acquisitions and releases work).
func TestRenameDenied(t *testing.T) {
	s := redistest.Start(t, durable...)
	ctx := context.Background()
	if err := s.Client(t).Do(ctx, "ACL", "SETUSER", "norename", "on", ">pw", "~*", "&*", "+@all", "-rename").Err(); err != nil {
		t.Fatal(err)
	}
	o := &redis.Options{Addr: s.Addr, Username: "norename", Password: "pw"}

	// The user locks and releases.
	lease, actx := acquireAs(t, o, "norename")
	if err := lease.Release(actx); err != nil {
		t.Fatalf("Release as a user denied RENAME: %v", err)
	}

	fs := run(t, doctor.Config{Standalone: o, ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	lacks(t, fs, "command-denied")
	has(t, fs, "rename-denied", doctor.Warning, s.Addr)
}

// TestKeyPatternsWithoutReleasedBy: an ACL that grants fence's keys one
// pattern per key of the layout before the released-by record
// (~fence:{*}, ~fence:{*}:token, ...). The release script declares
// P:{N}:released-by as a key, and Redis checks a script's declared keys
// before it runs: every Release fails with NOPERM ("no permissions to
// access one of the keys used as arguments") and the lock stays held for
// its lease time. The doctor ran its EVAL probes with the lock's key
// alone and called it a warning (rename-denied, from RENAME's dry run);
// its EVAL and EVALSHA dry runs now declare the release script's keys,
// and a user refused them gets the critical command-denied.
func TestKeyPatternsWithoutReleasedBy(t *testing.T) {
	s := redistest.Start(t, durable...)
	ctx := context.Background()
	admin := s.Client(t)
	if err := admin.Do(ctx, "ACL", "SETUSER", "oldkeys", "on", ">pw", "~fence:{*}", "~fence:{*}:token", "~fence:{*}:queue",
		"~fence:{*}:waiters", "~fence:{*}:waiting", "~fence:{*}:revoked:*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	o := &redis.Options{Addr: s.Addr, Username: "oldkeys", Password: "pw"}

	// What the finding is about: the user takes locks, and cannot release them.
	lease, actx := acquireAs(t, o, "oldkeys")
	if err := lease.Release(actx); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("Release as a user with the old layout's key patterns = %v, want NOPERM", err)
	}
	if ttl := admin.PTTL(ctx, "fence:{oldkeys}").Val(); ttl < 0 {
		t.Fatalf("the lock is gone after the failed Release (PTTL %v): the premise is gone", ttl)
	}

	f := has(t, run(t, doctor.Config{Standalone: o, ReplicaSync: redislock.ReplicaSync{Disabled: true}}), "command-denied", doctor.Critical, s.Addr)
	if !strings.Contains(f.Why, "EVALSHA") {
		t.Fatalf("Why %q; want EVALSHA named", f.Why)
	}
}

// acquireAs takes the lock name for a minute as the ACL user of o,
// replica sync off, and returns its lease and a context of 10 s for it.
func acquireAs(t *testing.T, o *redis.Options, name string) (fence.Lease, context.Context) {
	t.Helper()
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	l, err := redislock.New(c, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	lease, err := l.Acquire(ctx, name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatalf("Acquire as ACL user %s: %v", o.Username, err)
	}
	return lease, ctx
}
