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
// its released-by record (release.lua's RENAME), so an ACL user denied
// RENAME takes locks but every Release fails with the script's permission
// error. The doctor did not ask ACL DRYRUN about RENAME and reported
// nothing for that user: no finding at all ("unexpected" clean audit).
// It now says that the user may not run RENAME on fence's keys.
func TestRenameDenied(t *testing.T) {
	s := redistest.Start(t, durable...)
	ctx := context.Background()
	if err := s.Client(t).Do(ctx, "ACL", "SETUSER", "norename", "on", ">pw", "~*", "&*", "+@all", "-rename").Err(); err != nil {
		t.Fatal(err)
	}
	o := &redis.Options{Addr: s.Addr, Username: "norename", Password: "pw"}

	// What the finding is about: this user's Release fails.
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
	if err := lease.Release(actx); err == nil || !strings.Contains(err.Error(), "can't run this command") {
		t.Fatalf("Release as a user denied RENAME = %v, want the script's permission error", err)
	}
	if err := l.WaitGiveBacks(actx); err != nil {
		t.Fatal(err)
	}

	f := has(t, run(t, doctor.Config{Standalone: o, ReplicaSync: redislock.ReplicaSync{Disabled: true}}), "command-denied", doctor.Critical, s.Addr)
	if !strings.Contains(f.Why, "may not run RENAME on fence") || !strings.Contains(f.Fix, "+rename") {
		t.Fatalf("user denied RENAME: Why %q, Fix %q; want RENAME named", f.Why, f.Fix)
	}
}
