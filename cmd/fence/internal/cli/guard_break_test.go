//go:build linux

package cli_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	fencelib "github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/internal/redistest"
)

// TestFencedWriterHelper is not a test: run by fence exec (the test binary
// as the command), it makes one write to the guarded server at
// $GUARDTEST_ADDR with the lease's $FENCE_TOKEN, once $GUARDTEST_DIR/go
// exists if $GUARDTEST_DIR is set, and leaves the answer's status in
// $GUARDTEST_DIR/status; it exits 0 if the write was accepted.
func TestFencedWriterHelper(t *testing.T) {
	t.Parallel()
	addr, dir := os.Getenv(writerAddrEnv), os.Getenv(writerDirEnv)
	if addr == "" {
		t.Skip("run by TestExecKilledParentOrphanIsFenced under fence exec")
	}
	if dir != "" {
		// Started, so past setsid (which execs this binary): the test
		// kills A only after this, so that A's end cannot reach the
		// writer while it is still in A's process group.
		_ = os.WriteFile(filepath.Join(dir, "ready"), nil, 0o600)
		tick := time.NewTicker(5 * time.Millisecond)
		for _, err := os.Stat(filepath.Join(dir, "go")); err != nil; _, err = os.Stat(filepath.Join(dir, "go")) {
			<-tick.C
		}
	}
	req, err := http.NewRequest(http.MethodPost, addr, nil)
	if err != nil {
		os.Exit(2)
	}
	req.Header.Set(guard.TokenHeader, os.Getenv("FENCE_TOKEN"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	resp.Body.Close()
	if dir != "" {
		_ = os.WriteFile(filepath.Join(dir, "status.tmp"), []byte(fmt.Sprint(resp.StatusCode)), 0o600)
		_ = os.Rename(filepath.Join(dir, "status.tmp"), filepath.Join(dir, "status"))
	}
	if resp.StatusCode != http.StatusOK {
		os.Exit(3)
	}
	os.Exit(0)
}

// TestExecKilledParentOrphanIsFenced: the command of fence exec A starts a
// fenced writer in the background, and A is killed (SIGKILL) before the
// writer writes. The command and its group die with A (the exec shim ends
// them); the background writer, which left the group (setsid), does not
// (exec's help says so), and still holds A's token, whose lease
// ends once its watchdog TTL passes without renewal. fence exec B then
// takes the lock and writes with its greater token; the orphan's late
// write with A's token must be refused (409), and B's be the only write.
func TestExecKilledParentOrphanIsFenced(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	var mu sync.Mutex
	var accepted []fencelib.Token // in the order the guard let them write
	mw := guard.Middleware(&guard.MemoryStore{}, guard.HTTPOptions{
		Resource: func(*http.Request) (string, error) { return "payment:1001", nil },
		Logger:   slog.New(slog.DiscardHandler),
	})
	guarded := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, _ := guard.ParseToken(r.Header.Get(guard.TokenHeader))
		mu.Lock()
		accepted = append(accepted, token)
		mu.Unlock()
	})))
	defer guarded.Close()

	dir := t.TempDir()
	helper := []string{os.Args[0], "-test.run=^TestFencedWriterHelper$"}
	a := exec.Command(fenceBin, append([]string{"exec", "--redis", redisURL(srv), "--watchdog-ttl", "600ms",
		"lock:payment:1001", "--", "sh", "-c", `setsid "$@" 2> "$D/stderr" & echo $! > "$D/pid.tmp"; mv "$D/pid.tmp" "$D/pid"; wait`, "sh"},
		helper...)...)
	a.Env = append(os.Environ(), writerAddrEnv+"="+guarded.URL, writerDirEnv+"="+dir, "D="+dir)
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	orphan := watch(t, readPID(t, filepath.Join(dir, "pid")))
	// A loaded CI run killed A before the writer had left A's group: it
	// died with it, stderr empty.
	for end := time.Now().Add(30 * time.Second); ; {
		if _, err := os.Stat(filepath.Join(dir, "ready")); err == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the background writer did not start within 30 s")
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
	_ = a.Process.Kill()
	_ = a.Wait()
	if orphan.exited(300 * time.Millisecond) {
		b, _ := os.ReadFile(filepath.Join(dir, "stderr"))
		t.Fatalf("A's background writer, in a session of its own, exited with A (exec's help says it runs on): %s", b)
	}

	b := exec.Command(fenceBin, append([]string{"exec", "--redis", redisURL(srv), "--wait", "30s",
		"lock:payment:1001", "--"}, helper...)...)
	b.Env = append(os.Environ(), writerAddrEnv+"="+guarded.URL)
	if out, err := b.CombinedOutput(); err != nil {
		t.Fatalf("fence exec B: %v\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitFile(t, filepath.Join(dir, "status"))
	status, _ := os.ReadFile(filepath.Join(dir, "status"))
	mu.Lock()
	defer mu.Unlock()
	if string(status) != "409" || len(accepted) != 1 {
		t.Fatalf("the orphan's write with the killed holder's token got %s; accepted tokens %v, want B's alone", status, accepted)
	}
	if !orphan.exited(10 * time.Second) {
		t.Fatal("the orphan still runs after its write")
	}
}
