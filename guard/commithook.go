package guard

import (
	"context"
	"database/sql"
	"errors"
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
// reflection: guard imports no driver) and RegisterRollbackHook, Tx runs
// on a connection of its own with a commit hook that refuses every commit
// but Tx's own while fn runs: an autocommit statement after such a
// rollback is rolled back and fails. The rollback hook tells Tx that the
// fenced transaction is over, so that it does not commit one fn opened
// after it (SAVEPOINT, BEGIN; TestSavepointAfterImplicitRollback). The
// hooks are registered once per connection, the first time a Tx runs on
// it, and stay, doing nothing between Txs (TestTxCommitHookRemoved,
// TestTxHooksNotHeldPerTx): those the application registered on that
// connection are replaced for good, and one it registers there afterwards
// replaces Tx's, whose Txs on that connection are then unprotected.

// commitGate is the hooks' state for one Tx: ended is set by the rollback
// hook when the database rolls back a whole transaction (the fenced one,
// by itself or refusing a commit); commits pass once allow is set (Tx's
// own) if the fenced transaction has not ended, and refused counts those
// refused.
type commitGate struct {
	allow   atomic.Bool
	ended   atomic.Bool
	refused atomic.Int32
}

func (g *commitGate) pass() bool {
	if g.allow.Load() && !g.ended.Load() {
		return true
	}
	g.refused.Add(1)
	return false
}

// over says whether the fenced transaction was rolled back while fn ran:
// then whatever transaction is open on the connection is fn's own,
// begun after (a SAVEPOINT or BEGIN in autocommit mode), and Tx must not
// commit it (TestSavepointAfterImplicitRollback). nil if not (or g is
// nil).
func (g *commitGate) over() error {
	if g == nil || !g.ended.Load() {
		return nil
	}
	return errors.New("guard: the database rolled back the fenced transaction while fn ran (a statement's failure, a commit refused, or ctx's end): nothing fn wrote after it is committed")
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

// hookSlot is one connection's hooks' state. The hooks are registered
// once per connection and left in place (a driver may hold every callback
// registered until the connection closes: mattn/go-sqlite3 does, and hooks
// set per Tx grew a pooled connection by some 300 bytes a Tx,
// TestTxHooksNotHeldPerTx): gate is the Tx running on the connection, nil
// between Txs, when the hooks let every commit through and note nothing.
type hookSlot struct{ gate atomic.Pointer[commitGate] }

func (s *hookSlot) commit() bool {
	g := s.gate.Load()
	return g == nil || g.pass()
}

func (s *hookSlot) rollback() {
	if g := s.gate.Load(); g != nil {
		g.ended.Store(true)
	}
}

// slots holds the hookSlot of each connection that has its hooks, by a
// weak pointer to the driver's connection, dropped with it.
var slots sync.Map // weak.Pointer[byte] -> *hookSlot

// slotOf returns dc's hookSlot, registering its hooks the first time, or
// nil if dc takes none (or is not a pointer to the connection's state,
// which the slot could not be kept by).
func slotOf(dc any) *hookSlot {
	v := reflect.ValueOf(dc)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Type().Elem().Size() == 0 {
		return nil
	}
	p := (*byte)(v.UnsafePointer())
	key := weak.Make(p)
	if s, ok := slots.Load(key); ok {
		return s.(*hookSlot)
	}
	s := &hookSlot{}
	if !setHooks(dc, s) {
		return nil
	}
	slots.Store(key, s)
	runtime.AddCleanup(p, func(k weak.Pointer[byte]) { slots.Delete(k) }, key)
	return s
}

// begin starts Tx's transaction: with a commit gate on a connection of its
// own if db's connections take the hooks, else db.BeginTx. end, never nil,
// takes the gate off the connection and gives the connection back, after
// the transaction has ended; gate is nil without hooks.
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
	var slot *hookSlot
	if err := conn.Raw(func(dc any) error {
		slot = slotOf(dc)
		return nil
	}); err != nil {
		_ = conn.Close()
		return nil, nil, func() {}, err
	}
	if slot == nil {
		if _, loaded := hookless.LoadOrStore(key, struct{}{}); !loaded {
			runtime.AddCleanup(db, func(k weak.Pointer[sql.DB]) { hookless.Delete(k) }, key)
		}
		end = func() { _ = conn.Close() }
	} else {
		gate = &commitGate{}
		slot.gate.Store(gate)
		end = func() {
			slot.gate.CompareAndSwap(gate, nil)
			_ = conn.Close()
		}
	}
	tx, err = conn.BeginTx(ctx, nil)
	if err != nil {
		end()
		return nil, nil, func() {}, err
	}
	return tx, gate, end, nil
}

// setHooks registers s's commit and rollback hooks on dc (a commit goes
// through only if s.commit returns true; a rollback of a whole transaction
// calls s.rollback) and reports whether dc takes both: methods
// RegisterCommitHook(f), f a func() of an int32 or int result, non-zero
// turning the commit into a rollback (sqlite3_commit_hook), and
// RegisterRollbackHook(func()) (sqlite3_rollback_hook). It sets nothing
// if dc lacks either.
func setHooks(dc any, s *hookSlot) bool {
	v := reflect.ValueOf(dc)
	cm, rm := v.MethodByName("RegisterCommitHook"), v.MethodByName("RegisterRollbackHook")
	ct, ok := hookParam(cm)
	if !ok || ct.NumIn() != 0 || ct.NumOut() != 1 {
		return false
	}
	rt, ok := hookParam(rm)
	if !ok || rt.NumIn() != 0 || rt.NumOut() != 0 {
		return false
	}
	var cf reflect.Value
	switch ct.Out(0).Kind() {
	case reflect.Int32:
		cf = reflect.ValueOf(func() int32 {
			if s.commit() {
				return 0
			}
			return 1
		})
	case reflect.Int:
		cf = reflect.ValueOf(func() int {
			if s.commit() {
				return 0
			}
			return 1
		})
	default:
		return false
	}
	rf := reflect.ValueOf(s.rollback)
	if !cf.Type().ConvertibleTo(ct) || !rf.Type().ConvertibleTo(rt) {
		return false
	}
	rm.Call([]reflect.Value{rf.Convert(rt)})
	cm.Call([]reflect.Value{cf.Convert(ct)})
	return true
}

// hookParam returns the type of m's one parameter if m is a method of one
// function parameter and no result.
func hookParam(m reflect.Value) (reflect.Type, bool) {
	if !m.IsValid() || m.Type().NumIn() != 1 || m.Type().NumOut() != 0 || m.Type().In(0).Kind() != reflect.Func {
		return nil, false
	}
	return m.Type().In(0), true
}
