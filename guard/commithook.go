package guard

import (
	"context"
	"database/sql"
	"fmt"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"weak"
)

// SQLite ends a transaction by itself when some statements fail (a write
// interrupted by its own ctx, a trigger's RAISE(ROLLBACK), INSERT OR
// ROLLBACK, SQLITE_FULL, IOERR, NOMEM): the fence goes with it and the
// database's write lock is released, but database/sql's Tx stays open on a
// connection now in autocommit mode, and each later statement of fn
// through it committed on its own, unfenced, after a newer holder's write
// (TestImplicitRollbackInFn: the row ended with the stale holder's
// value). Tx cannot see fn's statements; the driver can. For a driver
// whose connections offer RegisterCommitHook (modernc.org/sqlite's, whose
// hook is a func() int32, and mattn/go-sqlite3's, a func() int; found by
// reflection: guard imports no driver), Tx runs on a connection of its own
// with a commit hook that refuses every commit but Tx's own while fn runs:
// an autocommit statement after such a rollback is rolled back and fails.
// The hook is removed when Tx ends (TestTxCommitHookRemoved); one the
// application registered on that connection is replaced, and gone after.

// commitGate is the hook's state for one Tx: commits pass once allow is
// set (Tx's own), and refused counts those refused before.
type commitGate struct {
	allow   atomic.Bool
	refused atomic.Int32
}

func (g *commitGate) pass() bool {
	if g.allow.Load() {
		return true
	}
	g.refused.Add(1)
	return false
}

// refusals says how many commits g refused while fn ran, nil if none (or
// g is nil).
func (g *commitGate) refusals() error {
	if g == nil || g.refused.Load() == 0 {
		return nil
	}
	return fmt.Errorf("guard: refused %d commit(s) made during fn: fn's own, or of statements run outside the fenced transaction after the database ended it", g.refused.Load())
}

// hookless remembers the pools whose connections take no commit hook
// (PostgreSQL's), by a weak pointer to the *sql.DB, dropped with it: they
// go on through db.BeginTx, which retries a pooled connection found broken
// (sql.Conn.BeginTx does not). Remembered per pool, not per driver type:
// a pool of the same driver opened with sql.OpenDB through a connector that
// wraps its connections takes no hook, and must not take it from the
// others (TestCommitHookNotLostToWrappedPool).
var hookless sync.Map // weak.Pointer[sql.DB] -> struct{}

// begin starts Tx's transaction: with a commit gate on a connection of its
// own if db's driver takes a commit hook, else db.BeginTx. end, never nil,
// removes the hook and gives the connection back, after the transaction
// has ended; gate is nil without a hook.
func begin(ctx context.Context, db *sql.DB) (tx *sql.Tx, gate *commitGate, end func(), err error) {
	key := weak.Make(db)
	if _, ok := hookless.Load(key); ok {
		tx, err = db.BeginTx(ctx, nil)
		return tx, nil, func() {}, err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, nil, func() {}, err
	}
	gate = &commitGate{}
	hooked := false
	if err := conn.Raw(func(dc any) error {
		hooked = setCommitHook(dc, gate.pass)
		return nil
	}); err != nil {
		_ = conn.Close()
		return nil, nil, func() {}, err
	}
	if !hooked {
		gate = nil
		if _, loaded := hookless.LoadOrStore(key, struct{}{}); !loaded {
			runtime.AddCleanup(db, func(k weak.Pointer[sql.DB]) { hookless.Delete(k) }, key)
		}
	}
	end = func() {
		if hooked {
			_ = conn.Raw(func(dc any) error {
				setCommitHook(dc, nil)
				return nil
			})
		}
		_ = conn.Close()
	}
	tx, err = conn.BeginTx(ctx, nil)
	if err != nil {
		end()
		return nil, nil, func() {}, err
	}
	return tx, gate, end, nil
}

// setCommitHook registers pass as dc's commit hook (a commit goes through
// only if it returns true), or removes dc's hook if pass is nil, and
// reports whether dc takes one: a method RegisterCommitHook(f) whose f is
// a func() of an int32 or int result, non-zero turning the commit into a
// rollback (sqlite3_commit_hook).
func setCommitHook(dc any, pass func() bool) bool {
	m := reflect.ValueOf(dc).MethodByName("RegisterCommitHook")
	if !m.IsValid() || m.Type().NumIn() != 1 || m.Type().NumOut() != 0 {
		return false
	}
	ft := m.Type().In(0)
	if ft.Kind() != reflect.Func || ft.NumIn() != 0 || ft.NumOut() != 1 {
		return false
	}
	var f reflect.Value
	switch {
	case pass == nil:
		f = reflect.Zero(ft)
	case ft.Out(0).Kind() == reflect.Int32:
		f = reflect.ValueOf(func() int32 {
			if pass() {
				return 0
			}
			return 1
		})
	case ft.Out(0).Kind() == reflect.Int:
		f = reflect.ValueOf(func() int {
			if pass() {
				return 0
			}
			return 1
		})
	default:
		return false
	}
	if !f.Type().ConvertibleTo(ft) {
		return false
	}
	m.Call([]reflect.Value{f.Convert(ft)})
	return true
}
