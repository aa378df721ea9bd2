// Package pgserver starts a real PostgreSQL server in the manner of
// net/http/httptest: initdb in a temp dir, postgres on a free loopback port
// as a child of the calling process (so it dies with it), and fresh
// databases on demand. Start returns a handle whose Close the caller must
// call. The package does not import testing; internal/pgtest wraps it for
// tests.
package pgserver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fencekit/fence/internal/child"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver
)

const installHint = "install it with `apt-get install -y postgresql` (`make test` does this)"

// Server is one postgres process.
type Server struct {
	Port int // on 127.0.0.1

	bin, dir, data string
	cred           *syscall.Credential
	proc           *os.Process
	done           chan struct{}
	dbs            atomic.Int64
}

// binDir finds PostgreSQL's server binaries: on PATH, else Debian's
// /usr/lib/postgresql/N/bin (newest N).
func binDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", fmt.Errorf("PostgreSQL's initdb not found: %s", installHint)
}

// Start runs initdb and postgres in a new temp dir and waits until the
// server accepts connections. PostgreSQL refuses to run as root, so as root
// both run as the postgres user. The caller must Close the server.
func Start() (*Server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "fence-pg-")
	if err != nil {
		return nil, err
	}
	// postgres runs in its own working directory: a relative TMPDIR
	// would name another place there (its socket and lock files).
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, err
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root needs the postgres user: %s", installHint)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-A", "trust", "-U", "postgres", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	child.DieWithParent(initdb)
	if out, err := initdb.CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	for attempt := 0; ; attempt++ {
		s, err := start(bin, dir, data, cred, 0)
		if err == nil || attempt == 3 {
			if err != nil {
				_ = os.RemoveAll(dir)
			}
			return s, err
		}
	}
}

// start runs postgres on data; port 0 picks a free one.
func start(bin, dir, data string, cred *syscall.Credential, port int) (*Server, error) {
	if port == 0 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		port = l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
	}
	logf, err := os.OpenFile(filepath.Join(dir, "postgres.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(port), "-k", dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off",
		"-c", "full_page_writes=off", "-c", "max_connections=200")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	child.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	s := &Server{Port: port, bin: bin, dir: dir, data: data, cred: cred, proc: cmd.Process, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	if err := s.waitReady(); err != nil {
		s.stop()
		out, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
		return nil, fmt.Errorf("postgres on port %d did not start: %w\n%s", port, err, out)
	}
	return s, nil
}

// DSN returns a connection string for database db.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.Port, db)
}

func (s *Server) waitReady() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := sql.Open("pgx", s.DSN("postgres"))
	if err != nil {
		return err
	}
	defer db.Close()
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		select {
		case <-s.done:
			return errors.New("process exited")
		case <-ctx.Done():
			return ctx.Err()
		case <-retry.C:
		}
		// The server that answers must be this one, on its data
		// directory: the port may have been taken meanwhile by another
		// test's postgres, which answers while this one fails to bind.
		var data string
		if err := db.QueryRowContext(ctx, "SHOW data_directory").Scan(&data); err == nil {
			if data != s.data {
				return fmt.Errorf("another server took the port: it serves %s, not %s", data, s.data)
			}
			return nil
		}
		retry.Reset(20 * time.Millisecond)
	}
}

// stop ends the server: SIGQUIT (immediate shutdown), then SIGKILL.
func (s *Server) stop() {
	_ = s.proc.Signal(syscall.SIGQUIT)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		_ = s.proc.Kill()
		<-s.done
	}
}

// Restart stops the server as a crash would (immediate shutdown: no
// checkpoint, recovery from the WAL at start) and starts it again on the
// same port and data directory, keeping its databases.
func (s *Server) Restart() error { return s.RestartAfter(func() {}) }

// RestartAfter is Restart that calls whileDown once the server has stopped
// and starts it again when whileDown returns: a test that needs the server
// down past some event (a lease's expiry) waits for it there.
func (s *Server) RestartAfter(whileDown func()) error {
	s.stop()
	whileDown()
	n, err := start(s.bin, s.dir, s.data, s.cred, s.Port)
	if err != nil {
		return err
	}
	s.proc, s.done = n.proc, n.done
	return nil
}

// Close stops the server and removes its files.
func (s *Server) Close() {
	s.stop()
	_ = os.RemoveAll(s.dir)
}

// CreateDatabase creates a fresh database whose name starts with a counter
// and then hint, made safe for SQL, and returns its name, for processes
// that connect themselves (s.DSN(name)). Nothing drops it but Close.
func (s *Server) CreateDatabase(ctx context.Context, hint string) (string, error) {
	name := fmt.Sprintf("t%d_%s", s.dbs.Add(1), sanitize(hint))
	admin, err := sql.Open("pgx", s.DSN("postgres"))
	if err != nil {
		return "", err
	}
	defer admin.Close()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		return "", fmt.Errorf("create database: %w", err)
	}
	return name, nil
}

// CreateDB creates a fresh database whose name starts with a counter and
// then hint, made safe for SQL, and returns a handle to it. drop closes the
// handle and drops the database; the caller must call it.
func (s *Server) CreateDB(ctx context.Context, hint string) (db *sql.DB, drop func(), err error) {
	name, err := s.CreateDatabase(ctx, hint)
	if err != nil {
		return nil, nil, err
	}
	db, err = sql.Open("pgx", s.DSN(name))
	if err != nil {
		return nil, nil, err
	}
	return db, func() {
		_ = db.Close()
		if admin, err := sql.Open("pgx", s.DSN("postgres")); err == nil {
			_, _ = admin.Exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)")
			_ = admin.Close()
		}
	}, nil
}

func sanitize(name string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	s := b.String()
	if len(s) > 40 {
		s = s[:40]
	}
	return s
}
