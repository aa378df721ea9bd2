package pgserver

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The port check of commit a3ed942 tried again (branch break-today).

// TestRestartOnTakenPort: a server stops (as Restart's first step does),
// another test's postgres takes its port, and Restart runs: it must fail
// and say that another server took the port, not hand the other server to
// the test, and leave the other server running.
func TestRestartOnTakenPort(t *testing.T) {
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	o, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	// The other test's server moves to s's port once s is down.
	s.stop()
	o.stop()
	moved, err := start(o.bin, o.dir, o.data, o.cred, s.Port)
	if err != nil {
		t.Fatal(err)
	}
	o.proc, o.done, o.Port = moved.proc, moved.done, moved.Port
	began := time.Now()
	err = s.Restart()
	t.Logf("Restart after %v: %.300v", time.Since(began), err)
	if err == nil || !strings.Contains(err.Error(), "another server took the port") {
		t.Fatalf("Restart on a port another postgres took = %v, want 'another server took the port'", err)
	}
	db, err := sql.Open("pgx", o.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var data string
	if err := db.QueryRowContext(context.Background(), "SHOW data_directory").Scan(&data); err != nil || data != o.data {
		t.Errorf("the other server after the failed Restart: %q, %v", data, err)
	}
}

// TestStartWithRelativeTMPDIR: TMPDIR names a directory relative to the
// working directory (TMPDIR=tmp). os.MkdirTemp then returns a relative
// path, while postgres reports data_directory made absolute, so the new
// data_directory check could never match. Not a finding about a3ed942:
// it fails earlier, and failed before a3ed942 too, because postgres
// resolves the relative -k socket directory from inside its data
// directory ("could not create lock file tmp/…/.s.PGSQL.N.lock").
func TestStartWithRelativeTMPDIR(t *testing.T) {
	work := t.TempDir()
	for _, d := range []string{filepath.Dir(work), work} { // under root, postgres runs as its own user
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(work, "tmp"), 0o777); err != nil {
		t.Fatal(err)
	}
	t.Chdir(work)
	t.Setenv("TMPDIR", "tmp")
	s, err := Start()
	if err != nil {
		t.Fatalf("Start with TMPDIR=tmp (relative): %.500v", err)
	}
	s.Close()
}
