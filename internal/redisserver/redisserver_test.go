package redisserver_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/redisserver"
	"github.com/fencekit/fence/internal/testmain"
)

func TestMain(m *testing.M) { testmain.Run(m, nil) }

// A write made after CutLink is lost by Failover, and writes made before it
// are kept; Close removes the directory Start made.
func TestFailoverLosesUnreplicatedWrites(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	primary, err := redisserver.Start("")
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Close()
	replica, err := redisserver.StartReplica("", primary)
	if err != nil {
		t.Fatal(err)
	}
	defer replica.Close()
	if err := redisserver.WaitReplicated(primary, 1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	pc := primary.Client()
	defer pc.Close()
	if err := pc.Set(ctx, "before", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := pc.Do(ctx, "WAIT", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT = %d, %v", n, err)
	}
	if err := redisserver.CutLink(ctx, primary, replica); err != nil {
		t.Fatal(err)
	}
	if err := pc.Set(ctx, "after", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := redisserver.Failover(ctx, primary, replica); err != nil {
		t.Fatal(err)
	}
	rc := replica.Client()
	defer rc.Close()
	if n := rc.Exists(ctx, "before").Val(); n != 1 {
		t.Errorf("the promoted replica lost a replicated write")
	}
	if n := rc.Exists(ctx, "after").Val(); n != 0 {
		t.Errorf("the promoted replica has a write made after its link was cut")
	}
	if err := rc.Set(ctx, "new", "1", 0).Err(); err != nil {
		t.Errorf("the promoted replica refuses writes: %v", err)
	}
	primary.Close()
	if _, err := os.Stat(primary.Dir); !os.IsNotExist(err) {
		t.Errorf("Close left %s: %v", primary.Dir, err)
	}
}

// WaitReplicated on a primary with min-replicas-to-write 1 whose replica
// has not connected yet waits for it: the marker's NOREPLICAS is what is
// awaited, not a failure (doctor's cleanPair flaked on it under load).
func TestWaitReplicatedMinReplicas(t *testing.T) {
	primary, err := redisserver.Start("", "--min-replicas-to-write", "1")
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Close()
	// No replica yet: it waits its whole limit and says so.
	start := time.Now()
	if err := redisserver.WaitReplicated(primary, 1, 300*time.Millisecond); err == nil || time.Since(start) < 300*time.Millisecond {
		t.Fatalf("WaitReplicated without a replica = %v after %v, want a timeout after 300ms", err, time.Since(start))
	}
	waited := make(chan error, 1)
	go func() { waited <- redisserver.WaitReplicated(primary, 1, 30*time.Second) }()
	replica, err := redisserver.StartReplica("", primary)
	if err != nil {
		t.Fatal(err)
	}
	defer replica.Close()
	if err := <-waited; err != nil {
		t.Fatalf("WaitReplicated: %v", err)
	}
}
