package lab

import (
	"encoding/json"
	"sync"

	"golang.org/x/sys/unix"
)

// Mono reads CLOCK_MONOTONIC in nanoseconds. All processes on the machine
// share it, so the events of the workers and of the controller order.
func Mono() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// Event is one line of a worker's history.
type Event struct {
	Worker string   `json:"worker"`
	Op     string   `json:"op,omitempty"`    // unique id of the operation
	Kind   string   `json:"kind"`            // acquire, read, write, release, pause
	Phase  string   `json:"phase"`           // invoke, ok, fail, unknown
	Token  int64    `json:"token,omitempty"` // the lease's token
	Key    string   `json:"key,omitempty"`   // the resource register
	Value  []string `json:"value,omitempty"`
	Err    string   `json:"err,omitempty"`
	Mono   int64    `json:"mono"`
}

// History collects the events of one run.
type History struct {
	mu     sync.Mutex
	events []Event
	notify chan struct{} // closed and replaced on every append
}

func newHistory() *History { return &History{notify: make(chan struct{})} }

func (h *History) add(e Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, e)
	close(h.notify)
	h.notify = make(chan struct{})
}

// snapshot returns the events so far and a channel closed at the next one.
func (h *History) snapshot() ([]Event, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Event(nil), h.events...), h.notify
}

// Events returns a copy of all events.
func (h *History) Events() []Event {
	evs, _ := h.snapshot()
	return evs
}

func (e Event) line() []byte {
	b, _ := json.Marshal(e)
	return append(b, '\n')
}
