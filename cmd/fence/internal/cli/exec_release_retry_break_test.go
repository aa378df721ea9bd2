package cli_test

import (
	"bytes"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/redistest"
)

// droppingProxy forwards connections to target, except that once drop(n)
// is called, the next n requests (a client's writes, on any connection)
// are not forwarded: the proxy closes their connection instead, as a link
// that broke before the request reached the server. dropped says how many
// it dropped.
func droppingProxy(t *testing.T, target string) (addr string, drop func(n int), dropped func() int) {
	t.Helper()
	var mu sync.Mutex
	toDrop, nDropped := 0, 0
	take := func() bool {
		mu.Lock()
		defer mu.Unlock()
		if toDrop == 0 {
			return false
		}
		toDrop--
		nDropped++
		return true
	}
	addr = serveTCP(t, func(c net.Conn, track func(net.Conn), wg *sync.WaitGroup) {
		s, err := net.Dial("tcp", target)
		if err != nil {
			_ = c.Close()
			return
		}
		track(s)
		wg.Go(func() { // client -> server
			defer c.Close()
			defer s.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if take() {
						return
					}
					if _, err := s.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		})
		wg.Go(func() { // server -> client
			defer c.Close()
			defer s.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
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
	return addr,
		func(n int) { mu.Lock(); toDrop = n; mu.Unlock() },
		func() int { mu.Lock(); defer mu.Unlock(); return nDropped }
}

// TestExecReleaseRetriedAfterBrokenLink: the command has exited and fence
// exec releases the lock, but the link to Redis breaks under the release
// (here its first four requests are lost with their connections before
// reaching the server: go-redis's own retries, MaxRetries 3, all fail).
// fence.Run retries such an inconclusive Release for up to 5 s, since
// nobody else holds the lease to retry with; exec tried once, printed
// "release: ... EOF" and left the lock held with nobody holding it until
// its watchdog TTL ran out: every other fence exec of the name was refused
// (exit 75) for that long (here 60 s). Now exec retries as Run does, and
// the lock is free when it exits.
func TestExecReleaseRetriedAfterBrokenLink(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	addr, drop, dropped := droppingProxy(t, srv.Addr)
	dir := t.TempDir()
	// --watchdog-ttl 60s: no renewal (every 20 s) comes between the
	// command's start and the release.
	holder := exec.Command(fenceBin, "exec", "--redis", "redis://"+addr, "--watchdog-ttl", "60s", "job", "--",
		"sh", "-c", "touch "+dir+"/started; cat >/dev/null")
	stdin, err := holder.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	holder.Stderr = &stderr
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	waitFile(t, dir+"/started")
	drop(4)
	_ = stdin.Close() // the command exits; fence releases
	done := make(chan error, 1)
	go func() { done <- holder.Wait() }()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		_ = holder.Process.Kill()
		t.Fatalf("fence exec still running 30 s after its command exited (%s)", stderr.String())
	}
	if err != nil || dropped() != 4 {
		t.Fatalf("fence exec: %v, %d requests dropped, want 4; stderr %q", err, dropped(), stderr.String())
	}
	out, _, _ := fence(t, nil, "status", "--redis", redisURL(srv), "job")
	if !strings.Contains(out, "free") {
		t.Fatalf("lock after exec exited: %q; exec's stderr %q", out, stderr.String())
	}
}
