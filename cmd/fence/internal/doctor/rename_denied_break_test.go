package doctor_test

import (
	"context"
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
	c := redis.NewClient(o)
	defer c.Close()
	l, err := redislock.New(c, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	lease, err := l.Acquire(actx, "norename", fence.TTL(time.Minute))
	if err != nil {
		t.Fatalf("Acquire as a user denied RENAME: %v", err)
	}
	if err := lease.Release(actx); err != nil {
		t.Fatalf("Release as a user denied RENAME: %v", err)
	}

	fs := run(t, doctor.Config{Standalone: o, ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	lacks(t, fs, "command-denied")
	has(t, fs, "rename-denied", doctor.Warning, s.Addr)
}
