package guard_test

import (
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/internal/pgtest"
	"github.com/fencekit/fence/internal/testmain"
	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// One PostgreSQL and one Redis server for the package; each test gets a
// fresh database (pgtest.NewDB) or fresh keys.
var (
	pg        *pgtest.Server
	redisAddr string
)

func TestMain(m *testing.M) {
	testmain.Run(m, func() (func(), error) {
		var err error
		if pg, err = pgtest.Launch(); err != nil {
			return nil, err
		}
		stopRedis, err := testmain.Redis(&redisAddr)()
		if err != nil {
			pg.Kill()
			return nil, err
		}
		return func() { stopRedis(); pg.Kill() }, nil
	})
}

// databases returns a fresh PostgreSQL database and a fresh SQLite file.
func databases(t *testing.T) map[string]*sql.DB {
	lite, err := sql.Open("sqlite", guard.SQLiteDSN(filepath.Join(t.TempDir(), "guard.db")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lite.Close() })
	return map[string]*sql.DB{"postgres": pg.NewDB(t), "sqlite": lite}
}
