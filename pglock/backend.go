package pglock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"net"
	"reflect"
	"time"
)

// backendRef is the PostgreSQL backend of a connection: its PID, and the
// port of the client's end as the server sees it (pg_stat_activity's
// client_port; -1 over a Unix socket).
type backendRef struct {
	pid  int32
	port int32
	// opened: the connection was open by then (the client's clock), so
	// its backend had started: one that started later is another that
	// took the PID since (see terminateQuery).
	opened time.Time
}

// runTry runs the try's statement, on a connection taken for it alone so
// that, if its outcome is unknown and the driver closed the connection,
// the backend it went to is known: that backend may still run it (it was
// stalled, and the driver's cancel reached it idle; it was blocked on a row
// lock), after the give-up's free. It is recorded in a.stale. A
// statement the driver could not send (driver.ErrBadConn) is sent again on
// another connection, as database/sql does.
func (l *Locker) runTry(ctx context.Context, a *attempt) (int64, error) {
	var err error
	for range 3 {
		var conn *sql.Conn
		if conn, err = l.db.Conn(ctx); err != nil {
			a.noConn = true
			return 0, err
		}
		a.noConn = false
		opened := time.Now()
		var token int64
		err = conn.QueryRowContext(ctx, l.q.acquire, a.name, a.owner, a.ttl.Microseconds()).Scan(&token)
		if err != nil && !errors.Is(err, sql.ErrNoRows) && !errors.Is(err, driver.ErrBadConn) {
			if b, ok := closedBackend(conn); ok {
				b.opened = opened
				a.stale = append(a.stale, b)
			}
		}
		_ = conn.Close()
		if !errors.Is(err, driver.ErrBadConn) {
			return token, err
		}
	}
	return 0, err
}

// pgConn is what pglock uses of pgx's *pgconn.PgConn (v5, and v4's v1).
type pgConn interface {
	PID() uint32
	IsClosed() bool
	Conn() net.Conn
}

// closedBackend returns the backend of conn if its driver is pgx's stdlib
// (or a wrapper that embeds its *stdlib.Conn) and the driver has closed the
// connection: the backend may still run the last statement, and nobody
// else will use it. Other drivers do not tell their backend's PID without
// a round trip; with them, the give-up frees the row without terminating.
func closedBackend(conn *sql.Conn) (b backendRef, ok bool) {
	_ = conn.Raw(func(dc any) error {
		pc := pgConnOf(dc)
		if pc == nil || !pc.IsClosed() || pc.PID() == 0 || pc.PID() > 1<<31-1 {
			return nil
		}
		nc := pc.Conn()
		if nc == nil {
			return nil
		}
		switch addr := nc.LocalAddr().(type) {
		case *net.TCPAddr:
			if addr == nil {
				return nil
			}
			b.port = int32(addr.Port)
		case *net.UnixAddr:
			b.port = -1
		default:
			return nil
		}
		b.pid, ok = int32(pc.PID()), true
		return nil
	})
	return b, ok
}

// pgConnOf returns the *pgconn.PgConn of a pgx stdlib driver connection,
// nil for other drivers: (*stdlib.Conn).Conn() is a *pgx.Conn, whose
// PgConn() is a *pgconn.PgConn. Reflection, not an interface, as those
// methods return pgx's types, and the fence module requires no driver.
func pgConnOf(dc any) pgConn {
	call := func(v reflect.Value) (reflect.Value, bool) {
		if !v.IsValid() || v.Type().NumIn() != 0 || v.Type().NumOut() != 1 {
			return reflect.Value{}, false
		}
		r := v.Call(nil)[0]
		if r.Kind() != reflect.Pointer || r.IsNil() {
			return reflect.Value{}, false
		}
		return r, true
	}
	v := reflect.ValueOf(dc)
	if !v.IsValid() {
		return nil
	}
	px, ok := call(v.MethodByName("Conn"))
	if !ok {
		return nil
	}
	pc, ok := call(px.MethodByName("PgConn"))
	if !ok {
		return nil
	}
	c, _ := pc.Interface().(pgConn)
	return c
}
