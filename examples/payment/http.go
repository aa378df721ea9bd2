package payment

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
)

// Handler serves POST /payments/{id}/approve (the approver in the
// X-Approver header) and GET /payments/{id}. An approval sent with an
// Idempotency-Key header (or X-Idempotency-Key, as net/http knows it) goes
// through ApproveOnce: sent again with the same key and approver, after
// its answer was lost, it is answered as the first was, 200 and the
// approval's token, not 409. Error bodies are generic:
// 404 and 409 for the payment's state, 503 with Retry-After when another
// approval holds the payment's lock, the database asks for a retry
// (guard.ErrRetry), or PostgreSQL's statement_timeout cancelled a statement
// of the approval (SQLSTATE 57014, which rolled it back) while the request
// still waited for its answer, and 500 for a failure of Redis or the
// database, whose detail goes to Log.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments/{id}/approve", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
		by := r.Header.Get("X-Approver")
		if err != nil || by == "" {
			http.Error(w, "want /payments/<numeric id>/approve with an X-Approver header", http.StatusBadRequest)
			return
		}
		var token fence.Token
		if key, ok := idempotencyKey(r.Header); ok {
			token, err = s.ApproveOnce(r.Context(), id, by, key)
		} else {
			token, err = s.Approve(r.Context(), id, by)
		}
		switch {
		case err == nil:
			writeJSON(w, map[string]any{"id": id, "status": "APPROVED", "approved_by": by, "token": token})
		case errors.Is(err, ErrInvalidApprover):
			http.Error(w, fmt.Sprintf("want an X-Approver header of printable UTF-8, at most %d bytes", MaxApprover), http.StatusBadRequest)
		case errors.Is(err, ErrInvalidKey):
			http.Error(w, fmt.Sprintf("want an Idempotency-Key header of printable UTF-8, 1 to %d bytes", MaxKey), http.StatusBadRequest)
		case errors.Is(err, ErrNotFound):
			http.Error(w, "no such payment", http.StatusNotFound)
		case errors.Is(err, ErrAlreadyApproved):
			http.Error(w, "payment already approved", http.StatusConflict)
		case errors.Is(err, guard.ErrStale):
			http.Error(w, "approval overtaken by a newer one; GET the payment for its status", http.StatusConflict)
		case errors.Is(err, fence.ErrHeld), errors.Is(err, guard.ErrRetry):
			w.Header().Set("Retry-After", "1")
			http.Error(w, "payment is being approved by another request; try again", http.StatusServiceUnavailable)
		case sqlState(err) == "57014" && r.Context().Err() == nil:
			// statement_timeout cancelled a statement (waiting for a
			// row lock, say): the transaction rolled back, and the
			// client may try again. Not guard.ErrRetry, which means a
			// conflict; and not when the request's own context ended,
			// which cancels the statement with 57014 too: then nobody
			// listens, and the default case logs it.
			s.logger().WarnContext(r.Context(), "approve payment", "id", id, "err", err)
			w.Header().Set("Retry-After", "1")
			http.Error(w, "the database is busy; try again", http.StatusServiceUnavailable)
		default:
			s.internalError(w, r, "approve payment", id, err)
		}
	})
	mux.HandleFunc("GET /payments/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
		if err != nil {
			http.Error(w, "want a numeric id", http.StatusBadRequest)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), LockLease) // a hung database must not hold the request for ever
		defer cancel()
		p, err := Get(ctx, s.DB, id)
		switch {
		case errors.Is(err, ErrNotFound):
			http.Error(w, "no such payment", http.StatusNotFound)
		case err != nil:
			s.internalError(w, r, "read payment", id, err)
		default:
			writeJSON(w, p)
		}
	})
	return mux
}

// idempotencyKey returns the request's Idempotency-Key header, or its
// X-Idempotency-Key, and whether it has one (an empty one is refused by
// ApproveOnce). Either makes net/http send a POST again by itself.
func idempotencyKey(h http.Header) (string, bool) {
	for _, name := range []string{"Idempotency-Key", "X-Idempotency-Key"} {
		if v, ok := h[name]; ok && len(v) > 0 {
			return v[0], true
		}
	}
	return "", false
}

// internalError logs err, which may name servers and addresses, and
// answers with a generic 500: a Redis or database failure is not the
// client's to see, and not a reason to retry at once.
func (s *Service) internalError(w http.ResponseWriter, r *http.Request, what string, id int64, err error) {
	s.logger().ErrorContext(r.Context(), what, "id", id, "err", err)
	http.Error(w, "internal error", http.StatusInternalServerError)
}

// logger is Log, or slog's default.
func (s *Service) logger() *slog.Logger {
	if s.Log == nil {
		return slog.Default()
	}
	return s.Log
}

// sqlState returns err's PostgreSQL SQLSTATE, "" if it has none (pgx's
// *pgconn.PgError has one; SQLite's errors do not).
func sqlState(err error) string {
	var pg interface{ SQLState() string }
	if errors.As(err, &pg) {
		return pg.SQLState()
	}
	return ""
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
