package lab

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"

	"github.com/fencekit/fence/cmd/fence/lab/worker"
	"github.com/fencekit/fence/guard"
)

// Entry is one line of the resource's log (the lab_log table): the ground
// truth of what the database accepted and rejected. An accepted entry was
// written in the same transaction as the write it records; Seq is commit
// order.
type Entry struct {
	Seq      int      `json:"seq"`
	Op       string   `json:"op"`
	Worker   string   `json:"worker"`
	Kind     string   `json:"kind"` // write: one read-modify-write
	Key      string   `json:"key"`
	Token    int64    `json:"token"`
	Accepted bool     `json:"accepted"`
	Value    []string `json:"value,omitempty"` // what was written
	Mono     int64    `json:"mono"`
}

// Resource is the protected resource as users ship it: payment-shaped rows
// in a SQLite database (guard.SQLiteDSN), or in PostgreSQL for the
// PostgreSQL rows. Workers open the database file
// themselves and write through guard.Tx (protected) or with a plain UPDATE
// (control). For scenarios with a network hop it is also served over HTTP:
// protected through guard.Middleware with a guard.SQLStore, the handler
// reading and writing in the fenced transaction (guard.TxFrom); for the
// control by a plain handler that ignores the token.
type Resource struct {
	path string
	db   *sql.DB
	srv  *http.Server
	ln   net.Listener
}

// startResource opens the resource: a SQLite file in dir, or, with dsn,
// that PostgreSQL database.
func startResource(ctx context.Context, dir, dsn string, fenced bool) (*Resource, error) {
	path := filepath.Join(dir, "resource.db")
	if dsn != "" {
		path = dsn
	}
	db, err := worker.OpenDB(path)
	if err != nil {
		return nil, err
	}
	if err := worker.CreateSchema(ctx, db); err != nil {
		db.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		db.Close()
		return nil, err
	}
	r := &Resource{path: path, db: db, ln: ln}
	var h http.Handler
	if fenced {
		h = guard.Middleware(guard.SQLStore{DB: db}, guard.HTTPOptions{
			Resource: func(req *http.Request) (string, error) { return req.PathValue("key"), nil },
			Logger:   slog.New(slog.DiscardHandler),
		})(http.HandlerFunc(r.fenced))
	} else {
		h = http.HandlerFunc(r.open)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments/{key}", r.logRejected(h))
	r.srv = &http.Server{Handler: mux}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

// Addr is the HTTP resource's host:port.
func (r *Resource) Addr() string { return r.ln.Addr().String() }

func (r *Resource) close() {
	_ = r.srv.Close()
	_ = r.db.Close()
}

// op reads the request's operation; the token comes from guard's header.
func op(req *http.Request) (worker.Op, error) {
	var in worker.Request
	if err := json.NewDecoder(req.Body).Decode(&in); err != nil {
		return worker.Op{}, err
	}
	token, err := guard.ParseToken(req.Header.Get(guard.TokenHeader))
	return worker.Op{ID: in.Op, Worker: in.Worker, Key: req.PathValue("key"), Token: int64(token)}, err
}

// fenced is the handler behind guard's Middleware: the read-modify-write in
// the transaction that SQLStore fenced.
func (r *Resource) fenced(w http.ResponseWriter, req *http.Request) {
	o, err := op(req)
	tx, ok := guard.TxFrom(req.Context())
	if err != nil || !ok {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	read, written, err := worker.WriteIn(req.Context(), tx, o)
	answer(w, read, written, err)
}

// open is the control's handler: the same read-modify-write in a plain
// transaction, whatever the token.
func (r *Resource) open(w http.ResponseWriter, req *http.Request) {
	o, err := op(req)
	if err != nil {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	tx, err := r.db.BeginTx(req.Context(), nil)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	defer func() { _ = tx.Rollback() }()
	read, written, err := worker.WriteIn(req.Context(), tx, o)
	if err == nil {
		err = tx.Commit()
	}
	answer(w, read, written, err)
}

func answer(w http.ResponseWriter, read, written []string, err error) {
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(worker.Response{Read: read, Written: written})
}

// logRejected records in the log the requests that guard answered 409
// (stale token): their transaction was rolled back, or never begun.
func (r *Resource) logRejected(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var body []byte
		if req.Body != nil {
			var in json.RawMessage
			_ = json.NewDecoder(req.Body).Decode(&in)
			body = in
			req.Body = readCloser(body)
		}
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, req)
		if sw.status == http.StatusConflict {
			req.Body = readCloser(body)
			if o, err := op(req); err == nil {
				worker.LogRejected(context.WithoutCancel(req.Context()), r.db, o)
			}
		}
	})
}

func readCloser(b []byte) io.ReadCloser { return io.NopCloser(bytes.NewReader(b)) }

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

// Log returns the resource's log in commit order.
func (r *Resource) Log() ([]Entry, error) {
	rows, err := r.db.Query(`SELECT seq, op, worker, kind, key, token, accepted, value, mono FROM lab_log ORDER BY seq`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Entry
	for rows.Next() {
		var e Entry
		var raw string
		if err := rows.Scan(&e.Seq, &e.Op, &e.Worker, &e.Kind, &e.Key, &e.Token, &e.Accepted, &raw, &e.Mono); err != nil {
			return nil, err
		}
		if err := json.Unmarshal([]byte(raw), &e.Value); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// State returns the final ledger of every payment row.
func (r *Resource) State() (map[string][]string, error) {
	rows, err := r.db.Query(`SELECT id, ops FROM payment`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var id, raw string
		if err := rows.Scan(&id, &raw); err != nil {
			return nil, err
		}
		var ops []string
		if err := json.Unmarshal([]byte(raw), &ops); err != nil {
			return nil, err
		}
		out[id] = ops
	}
	return out, rows.Err()
}
