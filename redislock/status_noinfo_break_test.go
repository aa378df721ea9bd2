package redislock_test

import (
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestStatusWithoutInfo: an ACL user refused INFO (the common +@all
// -@dangerous), with replica sync off as the README advises for one, takes
// locks, and Status gives their state with the replica counts, which need
// INFO, unknown (ReplicasErr). state.lua asked INFO for the server's role
// and failed the whole call: "redislock: status \"lock:status-noinfo\":
// ERR The user executing the script can't run this command or subcommand
// script: ...".
func TestStatusWithoutInfo(t *testing.T) {
	srv := redistest.Start(t)
	if err := srv.Client(t).Do(ctx(t), "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-@dangerous").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "app", Password: "pw"})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Info(ctx(t), "replication").Err(); err == nil {
		t.Fatal("INFO allowed to the ACL user; the test needs it refused")
	}
	l := newLockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	const name = "lock:status-noinfo"
	lease := acquire(t, l, name, fence.TTL(time.Minute))
	st, err := l.Status(ctx(t), name)
	if err != nil || !st.Held || st.LastToken != lease.Token() {
		t.Fatalf("Status for a user refused INFO = %+v, %v; want held, token %d", st, err, lease.Token())
	}
	if st.ReplicasErr == nil {
		t.Fatalf("Status.ReplicasErr = nil, Replicas %+v; want the counts' error (INFO refused)", st.Replicas)
	}
}
