package main

import (
	"bufio"
	"context"
	"database/sql"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence/examples/payment"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/internal/redistest"
)

// TestSecondSignalEndsAtOnce: the first SIGTERM starts the graceful
// shutdown, which waits for the approvals in flight (here one that waits
// for the database's write lock, up to its busy timeout of 10 s). An
// operator who sends a second signal (Ctrl-C twice) wants paymentd gone
// now. Before, the second signal was swallowed like the first and
// paymentd waited out the approval.
func TestSecondSignalEndsAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "paymentd")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	rs := redistest.Start(t)
	rc := rs.Client(t)
	path := filepath.Join(t.TempDir(), "p.db")
	cmd := exec.CommandContext(ctx, bin, "-redis", "redis://"+rs.Addr, "-db", path, "-listen", "127.0.0.1:0")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	addr := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`serving \(POST.*addr=http://(\S+)`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
		_ = cmd.Wait()
		close(exited)
	}()
	var url string
	select {
	case url = <-addr:
	case <-exited:
		t.Fatal("paymentd exited at start")
	}

	db, err := sql.Open("sqlite", guard.SQLiteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	hold, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback()
	if _, err := hold.ExecContext(ctx, `UPDATE payment SET amount = amount WHERE id = 1001`); err != nil {
		t.Fatal(err)
	}
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+url+"/payments/1001/approve", nil)
		req.Header.Set("X-Approver", "alice")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	for deadline := time.Now().Add(10 * time.Second); rc.Exists(ctx, "fence:{"+payment.LockName(1001)+"}").Val() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the approval never took the lock")
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		t.Fatal("paymentd exited at the first SIGTERM with an approval in flight")
	case <-time.After(time.Second):
	}
	start := time.Now()
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(3 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
		t.Fatalf("paymentd still up %v after a second signal", time.Since(start).Round(time.Millisecond))
	}
}
