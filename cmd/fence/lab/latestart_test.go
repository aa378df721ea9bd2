package lab

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/cmd/fence/lab/worker"
)

// A worker that starts while another is paused inside its transaction
// (scenario 3's victim holds SQLite's write lock for its whole pause) finds
// its row without waiting for the write lock. In ci88 the other two workers
// started after the victim's first pause, waited out SQLite's busy timeout
// in EnsureRow's INSERT, and exited; nobody took the lock again, and the
// run failed with "fault did not bite" four times over (61 s).
func TestEnsureRowDoesNotWaitForAPausedWriter(t *testing.T) {
	r := testResource(t) // the row "p" exists
	ctx := context.Background()
	tx, err := r.db.BeginTx(ctx, nil) // _txlock=immediate: the write lock
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `UPDATE payment SET ops = ops WHERE id = 'p'`); err != nil {
		t.Fatal(err)
	}
	other, err := worker.OpenDB(r.path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ctx2, cancel := context.WithTimeout(ctx, 3*time.Second) // under the busy timeout, 10 s
	defer cancel()
	start := time.Now()
	if err := worker.EnsureRow(ctx2, other, "p"); err != nil {
		t.Fatalf("EnsureRow of a row that exists, with the write lock held elsewhere: %v after %v", err, time.Since(start))
	}
	// A row that does not exist still needs the lock: the controller
	// creates it before any worker starts (spawn).
	var n int
	if err := other.QueryRowContext(ctx2, `SELECT count(*) FROM payment`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows = %d, %v; want 1", n, err)
	}
}

// A worker that fails is noted as it exits, with its stderr, before the
// workers are waited for: its note comes first, not a later one that only
// follows from it (a pause nobody could take over).
func TestWorkerFailureNotedAtExit(t *testing.T) {
	r := testResource(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	x := &experiment{ctx: ctx, cfg: Config{Worker: []string{"sh", "-c", "echo 'lab worker: database is locked' >&2; exit 2"}},
		res: r, hist: newHistory(), stop: make(chan struct{})}
	w, err := x.spawn(Spec{ID: "w2", Key: "p"})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.done:
	case <-ctx.Done():
		t.Fatal("the worker did not exit")
	}
	x.mu.Lock()
	note := x.note
	x.mu.Unlock()
	if !strings.Contains(note, "worker w2") || !strings.Contains(note, "database is locked") {
		t.Fatalf("note = %q, want the worker's failure with its stderr", note)
	}
	x.noteOnce("fault did not bite: nobody took the lock while w1 was paused (op w1-3)")
	if x.note != note {
		t.Fatalf("a later note replaced the worker's failure: %q", x.note)
	}
	// A worker the lab kills on purpose is no failure.
	y := &experiment{ctx: ctx, cfg: Config{Worker: []string{"sleep", "30"}}, res: r, hist: newHistory(), stop: make(chan struct{})}
	v, err := y.spawn(Spec{ID: "w3", Key: "p"})
	if err != nil {
		t.Fatal(err)
	}
	v.kill()
	if y.note != "" {
		t.Fatalf("a worker killed on purpose was noted: %q", y.note)
	}
}
