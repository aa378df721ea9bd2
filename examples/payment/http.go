package payment

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
)

// Handler serves POST /payments/{id}/approve (the approver in the
// X-Approver header) and GET /payments/{id}.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments/{id}/approve", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
		by := r.Header.Get("X-Approver")
		if err != nil || by == "" {
			http.Error(w, "want /payments/<numeric id>/approve with an X-Approver header", http.StatusBadRequest)
			return
		}
		token, err := s.Approve(r.Context(), id, by)
		switch {
		case errors.Is(err, ErrNotFound):
			http.Error(w, err.Error(), http.StatusNotFound)
		case errors.Is(err, ErrAlreadyApproved), errors.Is(err, guard.ErrStale):
			http.Error(w, err.Error(), http.StatusConflict)
		case errors.Is(err, fence.ErrNotAcquired):
			w.Header().Set("Retry-After", "1")
			http.Error(w, "busy, try again later: "+err.Error(), http.StatusServiceUnavailable)
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
		default:
			writeJSON(w, map[string]any{"id": id, "status": "APPROVED", "approved_by": by, "token": token})
		}
	})
	mux.HandleFunc("GET /payments/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
		if err != nil {
			http.Error(w, "want a numeric id", http.StatusBadRequest)
			return
		}
		p, err := Get(r.Context(), s.DB, id)
		switch {
		case errors.Is(err, ErrNotFound):
			http.Error(w, err.Error(), http.StatusNotFound)
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
		default:
			writeJSON(w, p)
		}
	})
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
