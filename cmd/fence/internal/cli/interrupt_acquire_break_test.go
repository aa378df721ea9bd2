package cli_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// replyHoldingProxy forwards connections to target, except that the first
// connection to send a request containing match gets no more replies: the
// request reaches the server and runs there, its reply is withheld.
// held is closed when that request has gone through.
func replyHoldingProxy(t *testing.T, target, match string) (addr string, held <-chan struct{}) {
	t.Helper()
	heldc := make(chan struct{})
	var once sync.Once
	addr = serveTCP(t, func(c net.Conn, track func(net.Conn), wg *sync.WaitGroup) {
		s, err := net.Dial("tcp", target)
		if err != nil {
			_ = c.Close()
			return
		}
		track(s)
		var stall sync.Mutex // held by the reply copier's gate once this conn is chosen
		chosen := make(chan struct{})
		wg.Go(func() { // client -> server
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					hit := false
					if strings.Contains(strings.ToLower(string(buf[:n])), match) {
						once.Do(func() { hit = true })
					}
					if hit {
						stall.Lock()
						close(chosen)
						stall.Unlock()
					}
					if _, err := s.Write(buf[:n]); err != nil {
						return
					}
					if hit {
						close(heldc)
					}
				}
				if err != nil {
					return
				}
			}
		})
		wg.Go(func() { // server -> client, until chosen
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
				stall.Lock()
				select {
				case <-chosen:
					stall.Unlock()
					_, _ = io.Copy(io.Discard, s) // withheld
					return
				default:
				}
				stall.Unlock()
				if n > 0 {
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		})
	})
	return addr, heldc
}

// TestExecInterruptedAcquireLeavesNoLock: SIGINT to fence exec while its
// acquisition has run on Redis and its reply is still on the way (a slow
// link). fence exits 130, as it says; the lock its acquisition took must not
// stay behind for a lease time with nobody holding it: any other fence exec
// on the name is then refused (exit 75) for 30 s.
func TestExecInterruptedAcquireLeavesNoLock(t *testing.T) {
	t.Parallel()
	for _, wait := range []string{"0", "5s"} {
		t.Run("wait="+wait, func(t *testing.T) {
			t.Parallel()
			interruptedAcquire(t, wait)
		})
	}
}

func interruptedAcquire(t *testing.T, wait string) {
	srv := redistest.Start(t)
	// One acquisition first, so that the scripts are in the server's cache
	// and the first EVALSHA through the proxy runs (rather than being
	// answered NOSCRIPT).
	if out, errOut, code := fence(t, nil, "exec", "--no-replica-sync", "--redis", redisURL(srv), "lock:warm", "--", "true"); code != 0 {
		t.Fatalf("warm-up exec: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	addr, held := replyHoldingProxy(t, srv.Addr, "eval")
	cmd := exec.Command(fenceBin, "exec", "--no-replica-sync", "--wait", wait, "--redis", "redis://"+addr, "lock:int", "--", "true")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("fence never sent its acquisition; stderr %q", stderr.String())
	}
	rdb := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The acquisition ran on the server: the lock is taken.
	waitKey(ctx, t, rdb, "fence:{lock:int}")
	interrupt(t, cmd, &stderr)
	pttl, err := rdb.PTTL(ctx, "fence:{lock:int}").Result()
	if err != nil {
		t.Fatal(err)
	}
	if pttl > 0 {
		out, errOut, code := fence(t, nil, "exec", "--no-replica-sync", "--redis", redisURL(srv), "lock:int", "--", "true")
		t.Errorf("after fence exec exited %d on SIGINT, the lock it was taking is still held for %v: the next fence exec exits %d (stdout %q, stderr %q)",
			cli.ExitInterrupted, pttl, code, out, errOut)
	}
}

// TestExecInterruptedRedlockAcquireLeavesNoLock: the same with --redlock
// on three masters, each behind a proxy that withholds the reply to the
// acquisition: after SIGINT (exit 130) no master keeps the lock.
func TestExecInterruptedRedlockAcquireLeavesNoLock(t *testing.T) {
	t.Parallel()
	var direct, proxied []string
	var servers []*redistest.Server
	for range 3 {
		srv := redistest.Start(t)
		servers = append(servers, srv)
		direct = append(direct, redisURL(srv))
	}
	if out, errOut, code := fence(t, nil, "exec", "--redlock", strings.Join(direct, ","), "lock:warm", "--", "true"); code != 0 {
		t.Fatalf("warm-up exec: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	var helds []<-chan struct{}
	for _, srv := range servers {
		addr, held := replyHoldingProxy(t, srv.Addr, "eval")
		proxied = append(proxied, "redis://"+addr)
		helds = append(helds, held)
	}
	cmd := exec.Command(fenceBin, "exec", "--redlock", strings.Join(proxied, ","), "lock:int", "--", "true")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, held := range helds {
		select {
		case <-held:
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("fence never sent its acquisition to every master; stderr %q", stderr.String())
		}
	}
	for _, srv := range servers {
		waitKey(ctx, t, srv.Client(t), "redlock:{lock:int}")
	}
	interrupt(t, cmd, &stderr)
	for i, srv := range servers {
		if pttl, err := srv.Client(t).PTTL(ctx, "redlock:{lock:int}").Result(); err != nil {
			t.Fatal(err)
		} else if pttl > 0 {
			t.Errorf("after fence exec exited on SIGINT, master %d still holds the lock for %v", i, pttl)
		}
	}
}

// waitKey waits until key exists on rdb (an acquisition ran there), within
// ctx.
func waitKey(ctx context.Context, t *testing.T, rdb *redis.Client, key string) {
	t.Helper()
	for {
		n, err := rdb.Exists(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the acquisition never took %s", key)
		case <-time.After(5 * time.Millisecond): // polling with a deadline
		}
	}
}

// interrupt sends SIGINT to cmd, waits for it to exit and checks that it
// exited ExitInterrupted.
func interrupt(t *testing.T, cmd *exec.Cmd, stderr *bytes.Buffer) {
	t.Helper()
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	sigAt := time.Now()
	_ = cmd.Wait()
	t.Logf("fence exited %d %v after SIGINT; stderr %q", cmd.ProcessState.ExitCode(), time.Since(sigAt).Round(time.Millisecond), stderr.String())
	if code := cmd.ProcessState.ExitCode(); code != cli.ExitInterrupted {
		t.Errorf("exit %d after SIGINT, want %d; stderr %q", code, cli.ExitInterrupted, stderr.String())
	}
}
