package lab

import (
	"sync"

	"github.com/fencekit/fence/cmd/fence/lab/worker"
)

// Event is one line of a worker's history.
type Event = worker.Event

// Mono reads CLOCK_MONOTONIC in nanoseconds; see worker.Mono.
func Mono() int64 { return worker.Mono() }

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
