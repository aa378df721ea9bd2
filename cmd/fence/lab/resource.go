package lab

import (
	"encoding/json"
	"net"
	"net/http"
	"sync"

	"github.com/fencekit/fence/cmd/fence/lab/worker"
)

// Entry is one line of the resource's own log: the ground truth of what it
// accepted and rejected, in the order it decided.
type Entry struct {
	Seq      int      `json:"seq"`
	Op       string   `json:"op"`
	Worker   string   `json:"worker"`
	Kind     string   `json:"kind"` // read or write
	Key      string   `json:"key"`
	Token    int64    `json:"token"`
	Accepted bool     `json:"accepted"`
	Value    []string `json:"value,omitempty"` // what was written, or read
	Mono     int64    `json:"mono"`
}

// Resource is the protected resource: registers holding a list of op ids,
// read and written over HTTP with a token. Fenced, it rejects any read or
// write whose token is lower than the largest it has accepted for that
// register (the holder of the newest lease may read and then write); open,
// it accepts everything, as a resource that ignores tokens would.
type Resource struct {
	fenced bool
	srv    *http.Server
	ln     net.Listener

	mu    sync.Mutex
	log   []Entry
	state map[string][]string
	max   map[string]int64
}

func startResource(fenced bool) (*Resource, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Resource{fenced: fenced, ln: ln, state: map[string][]string{}, max: map[string]int64{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /read", func(w http.ResponseWriter, req *http.Request) { r.serve(w, req, "read") })
	mux.HandleFunc("POST /write", func(w http.ResponseWriter, req *http.Request) { r.serve(w, req, "write") })
	r.srv = &http.Server{Handler: mux}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

// Addr is the resource's host:port.
func (r *Resource) Addr() string { return r.ln.Addr().String() }

func (r *Resource) close() { _ = r.srv.Close() }

func (r *Resource) serve(w http.ResponseWriter, req *http.Request, kind string) {
	var in worker.Request
	if err := json.NewDecoder(req.Body).Decode(&in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	e := Entry{Seq: len(r.log) + 1, Op: in.Op, Worker: in.Worker, Kind: kind, Key: in.Key, Token: in.Token, Mono: Mono()}
	e.Accepted = !r.fenced || in.Token >= r.max[in.Key]
	if e.Accepted {
		r.max[in.Key] = max(r.max[in.Key], in.Token)
		if kind == "write" {
			r.state[in.Key] = append([]string(nil), in.Value...)
		}
		e.Value = append([]string(nil), r.state[in.Key]...)
	}
	r.log = append(r.log, e)
	r.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(worker.Response{Accepted: e.Accepted, Value: e.Value})
}

// Log returns a copy of the resource's log.
func (r *Resource) Log() []Entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Entry(nil), r.log...)
}

// State returns the final value of every register.
func (r *Resource) State() map[string][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string][]string, len(r.state))
	for k, v := range r.state {
		out[k] = append([]string(nil), v...)
	}
	return out
}

// acceptedAfter reports whether the log holds an accepted write to key by
// another worker than w, decided after mono.
func (r *Resource) acceptedAfter(key, w string, mono int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.log) - 1; i >= 0 && r.log[i].Mono > mono; i-- {
		if e := r.log[i]; e.Accepted && e.Kind == "write" && e.Key == key && e.Worker != w {
			return true
		}
	}
	return false
}
