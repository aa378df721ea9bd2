package redisserver_test

import (
	"context"
	"os"
	"syscall"
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

// WaitReplicated goes on when the server closes its marker's connection:
// Sentinel kills the normal clients of a replica it has just promoted, and
// a TestSentinelFailover run failed on "marker: redis: Conn is in a bad
// state: EOF". Here the replica is stopped (so WAIT keeps coming back
// short), every normal client of the primary is killed while
// WaitReplicated waits, and then the replica goes on.
func TestWaitReplicatedSurvivesClientKill(t *testing.T) {
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
	admin := primary.Client()
	defer admin.Close()
	replica.Signal(syscall.SIGSTOP)
	waited := make(chan error, 1)
	go func() { waited <- redisserver.WaitReplicated(primary, 1, 30*time.Second) }()
	// Kill the marker's connection once it is there (it is a normal
	// client; admin's own is killed too, and admin reconnects).
	for killed := int64(0); killed < 2; {
		n, err := admin.ClientKillByFilter(ctx, "TYPE", "normal", "SKIPME", "yes").Result()
		if err != nil {
			t.Fatal(err)
		}
		killed += n
		select {
		case err := <-waited:
			t.Fatalf("WaitReplicated returned %v with the replica stopped", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	replica.Signal(syscall.SIGCONT)
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("WaitReplicated after its connection was killed: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("WaitReplicated did not return")
	}
}
