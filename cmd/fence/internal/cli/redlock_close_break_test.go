package cli_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
)

// lockedAfterExit lists the nodes where name is locked, read the moment
// fence has exited.
func lockedAfterExit(t *testing.T, srvs []*redistest.Server, key string) []int {
	t.Helper()
	var on []int
	for i, s := range srvs {
		n, err := s.Client(t).Exists(context.Background(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			on = append(on, i)
		}
	}
	return on
}

// fence exec --redlock whose command exits at once, with one node behind a
// slow link (300 ms each way in, within the watchdog lease's 1 s node
// timeout): the acquisition there has not been granted when Release runs
// (Release revokes it), and both are still on their way when the process
// would exit. Close must wait for both: the slow node is left neither
// locked nor with the acquisition run after the release. And an exec that
// fails (the lock held by another owner on the two fast nodes) must not
// leave its try locked on the slow node either.
func TestExecRedlockQuickCommandSlowNode(t *testing.T) {
	var srvs []*redistest.Server
	for range 3 {
		srvs = append(srvs, redistest.Start(t))
	}
	slow := startSlowLink(t, srvs[2].Addr, 300*time.Millisecond)
	urls := strings.Join([]string{redisURL(srvs[0]), redisURL(srvs[1]), "redis://" + slow.addr()}, ",")
	key := redlock.DefaultPrefix + ":{quick}"
	for round := range 2 {
		start := time.Now()
		_, errOut, code := fence(t, nil, "exec", "--redlock", urls, "quick", "--", "true")
		took := time.Since(start)
		if code != 0 {
			t.Fatalf("round %d: exec --redlock: exit %d: %s", round, code, errOut)
		}
		if on := lockedAfterExit(t, srvs, key); len(on) != 0 {
			t.Fatalf("round %d: locked on nodes %v the moment exec exited (after %v)", round, on, took)
		}
		if strings.Contains(errOut, "not finished") {
			t.Fatalf("round %d: exec warned: %s", round, errOut)
		}
		t.Logf("round %d: exec took %v", round, took)
	}
	for _, s := range srvs[:2] {
		if err := s.Client(t).Set(context.Background(), key, "someone-else", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	_, errOut, code := fence(t, nil, "exec", "--redlock", urls, "quick", "--", "true")
	if code == 0 {
		t.Fatalf("exec of a lock held on a majority succeeded: %s", errOut)
	}
	if on := lockedAfterExit(t, srvs[2:], key); len(on) != 0 {
		t.Fatalf("the slow node is locked by the failed try the moment exec exited: %s", errOut)
	}
}
