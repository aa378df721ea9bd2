package cli_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
	"github.com/fencekit/fence/internal/redistest"
)

// TestExecShortWaitLaggingReplica: a free lock on a primary whose one
// replica lags (paused). The first try is answered: the script, then WAIT
// for the replica, which Redis times out after the sync timeout (1 s) and
// answers up to a clock tick later with 0 acknowledgements. That is
// fence.ErrNotReplicated, exit 75, whatever --wait is: Redis answered, and
// too few replicas confirmed the lock. exec's Acquire context, which ends
// 1 s after --wait, must not cut that answer off into exit 2 ("no answer
// from Redis").
func TestExecShortWaitLaggingReplica(t *testing.T) {
	t.Parallel()
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	replica.Pause(t)
	for _, wait := range []string{"1ms", "50ms", "100ms", "1s"} {
		st := time.Now()
		out, errOut, code := fence(t, nil, "exec", "--redis", redisURL(primary), "--wait", wait, "lock:lag-"+wait, "--", "echo", "ran")
		if code != cli.ExitNotAcquired || !strings.Contains(errOut, "replica") {
			t.Errorf("exec --wait %s, replica lagging: exit %d after %v, stdout %q, stderr %q; want %d (too few replicas confirmed)",
				wait, code, time.Since(st), out, errOut, cli.ExitNotAcquired)
		} else {
			t.Logf("exec --wait %s, replica lagging: exit %d after %v: %s", wait, code, time.Since(st), strings.TrimSpace(errOut))
		}
	}
}

// TestExecShortWaitHeldLaggingReplica: a lock held throughout --wait, on a
// primary whose replica lags. The first try finds it held and queues the
// owner, and its WAIT, which covers that write, is answered after the sync
// timeout: the lock was held throughout, exit 75, not 2.
func TestExecShortWaitHeldLaggingReplica(t *testing.T) {
	t.Parallel()
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	dir := t.TempDir()
	holder := exec.Command(fenceBin, "exec", "--redis", redisURL(primary), "held", "--", "sh", "-c", "touch "+dir+"/started; cat >/dev/null")
	stdin, _ := holder.StdinPipe()
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	waitFile(t, dir+"/started")
	replica.Pause(t)
	for _, wait := range []string{"1ms", "100ms"} {
		st := time.Now()
		out, errOut, code := fence(t, nil, "exec", "--redis", redisURL(primary), "--wait", wait, "held", "--", "echo", "ran")
		if code != cli.ExitNotAcquired {
			t.Errorf("exec --wait %s on a held lock, replica lagging: exit %d after %v, stdout %q, stderr %q; want %d",
				wait, code, time.Since(st), out, errOut, cli.ExitNotAcquired)
		} else {
			t.Logf("exec --wait %s on a held lock, replica lagging: exit %d after %v: %s", wait, code, time.Since(st), strings.TrimSpace(errOut))
		}
	}
	stdin.Close()
	_ = holder.Wait()
}

// TestExecLeaseOutlivesAcquireContext: exec's Acquire context ends a
// little after --wait (acquireContext); the lease it gave must not end with
// it. A command that runs well past that deadline keeps the lock, and the
// watchdog keeps renewing it (the key's PTTL goes back up after the
// deadline, and the key never goes away), and exec exits with the
// command's status 0.
func TestExecLeaseOutlivesAcquireContext(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	dir := t.TempDir()
	start := time.Now()
	holder := exec.Command(fenceBin, "exec", "--redis", redisURL(srv), "--no-replica-sync", "--wait", "100ms", "--watchdog-ttl", "2s",
		"long", "--", "sh", "-c", "touch "+dir+"/started; cat >/dev/null")
	stdin, _ := holder.StdinPipe()
	var stderr strings.Builder
	holder.Stderr = &stderr
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	waitFile(t, dir+"/started")
	// The acquire context ends at the latest 2.1 s after start; watch
	// the key until two watchdog lease times past that (a lease of 2 s,
	// not less: renewals of a shorter one missed on a loaded machine
	// would end it and fail the test for another reason).
	until := start.Add(2100*time.Millisecond + 2*2*time.Second)
	ctx := context.Background()
	var last time.Duration
	renewals := 0
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(until) {
		<-tick.C
		pttl, err := admin.PTTL(ctx, "fence:{long}").Result()
		if err != nil || pttl <= 0 {
			t.Fatalf("%v after exec started: the lock's PTTL is %v (%v): the lease ended while the command ran; stderr %q",
				time.Since(start), pttl, err, stderr.String())
		}
		if pttl > last && last > 0 && time.Since(start) > 2100*time.Millisecond {
			renewals++
		}
		last = pttl
	}
	if renewals == 0 {
		t.Errorf("no renewal seen after the acquire context's deadline")
	}
	stdin.Close()
	if err := holder.Wait(); err != nil {
		t.Fatalf("exec: %v; stderr %q", err, stderr.String())
	}
	t.Logf("%d renewals seen after the acquire context's deadline", renewals)
}
