package guard_test

import (
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/fencekit/fence/internal/pgtest"
	"github.com/fencekit/fence/internal/redistest"
	"go.uber.org/goleak"
	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// One PostgreSQL and one Redis server for the package; each test gets a
// fresh database (pgtest.NewDB) or fresh keys.
var (
	pg        *pgtest.Server
	redisAddr string
)

func TestMain(m *testing.M) {
	code := run(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func run(m *testing.M) int {
	var err error
	if pg, err = pgtest.Launch(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pg.Kill()
	dir, err := os.MkdirTemp("", "guard-redis")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer os.RemoveAll(dir)
	srv, err := redistest.Launch(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer srv.Kill()
	redisAddr = srv.Addr
	return m.Run()
}

// databases returns a fresh PostgreSQL database and a fresh SQLite file.
func databases(t *testing.T) map[string]*sql.DB {
	lite, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "guard.db")+
		"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lite.Close() })
	return map[string]*sql.DB{"postgres": pg.NewDB(t), "sqlite": lite}
}
