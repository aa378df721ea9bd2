package guard_test

import (
	"testing"
	"time"

	"github.com/fencekit/fence/internal/testmain"
)

// The tests here need no server; guard's tests against PostgreSQL, SQLite
// and Redis live in the tests module (tests/guard), so that the library's
// go.mod does not require the SQL drivers.
func TestMain(m *testing.M) { testmain.Run(m, nil) }

// clock is a fixed time for tests of MaxAhead: 1.8e15 µs since the epoch.
var clock = time.UnixMicro(1_800_000_000_000_000)

func fixedClock() time.Time { return clock }
