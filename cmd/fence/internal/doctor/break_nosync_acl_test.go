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

// With replica sync off (--no-replica-sync) redislock sends no WAIT and
// never runs the replica record script that reads INFO. An ACL user
// denied WAIT and INFO then locks fine (shown here), yet the doctor said
// "command-denied" (critical: "the acquisitions, renewals, releases or
// waits that send them fail") and fence doctor exited 3: a claim about
// commands the lockers do not send.
func TestNoReplicaSyncNeedsNoWaitOrInfo(t *testing.T) {
	s := redistest.Start(t, durable...)
	ctx := context.Background()
	if err := s.Client(t).Do(ctx, "ACL", "SETUSER", "nosync", "on", ">pw", "~*", "&*", "+@all", "-wait", "-info").Err(); err != nil {
		t.Fatal(err)
	}
	o := &redis.Options{Addr: s.Addr, Username: "nosync", Password: "pw"}

	// The lockers, as this user, with replica sync off: they work.
	c := redis.NewClient(o)
	defer c.Close()
	l, err := redislock.New(c, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	lease, err := l.Acquire(actx, "nosync", fence.TTL(time.Minute))
	if err != nil {
		t.Fatalf("Acquire as a user denied WAIT and INFO, replica sync off: %v", err)
	}
	if err := lease.Extend(actx, time.Minute); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if err := lease.Release(actx); err != nil {
		t.Fatalf("Release: %v", err)
	}

	fs := run(t, doctor.Config{Standalone: o, ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	lacks(t, fs, "command-denied")
	lacks(t, fs, "command-missing")

	// With replica sync on, the same user is refused: still a finding.
	has(t, run(t, doctor.Config{Standalone: o}), "command-denied", doctor.Critical, s.Addr)
}
