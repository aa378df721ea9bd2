// Package worker is a worker process of fence's fault lab: it takes leases
// and reads and writes the lab's resource as its Spec says, and writes its
// history to standard output as JSON lines. The lab/cmd/labworker command
// runs Main; the lab builds that command and starts one process per
// worker, so that a signal pauses exactly one client. The package is kept
// small (fence, redislock, go-redis) so that the command builds quickly.
package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"slices"
	"syscall"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sys/unix"
)

// Env names the environment variable that carries a worker's Spec.
const Env = "FENCE_LAB_WORKER"

// Spec tells a worker process what to do.
type Spec struct {
	ID       string        `json:"id"`
	Redis    string        `json:"redis"`    // host:port
	Lock     string        `json:"lock"`     // lock name
	Resource string        `json:"resource"` // host:port of the resource (or a proxy to it)
	Key      string        `json:"key"`      // the resource register
	Naive    bool          `json:"naive"`    // the naive lock: SET NX PX and an INCR counter
	Sync     bool          `json:"sync"`     // replica sync check (fence lock only)
	Replicas int           `json:"replicas"` // expected replicas for the sync check; 0 discovers
	Acks     int           `json:"acks"`     // the sync check's rule: 0 (one), a number, or redislock.AcksAll
	TTL      time.Duration `json:"ttl"`
	Wait     time.Duration `json:"wait"`
	Ops      int           `json:"ops"`   // leases to take; 0: until standard input closes
	Think    time.Duration `json:"think"` // time between leases
	// PauseAt lists the ops (1-based) at which the worker stops itself with
	// SIGSTOP, at PausePoint, until the controller sends SIGCONT.
	PauseAt    []int  `json:"pause_at,omitempty"`
	PausePoint string `json:"pause_point,omitempty"` // "acquired" or "read"
}

// Main runs a worker from the Spec in Env, writing its history as JSON
// lines to stdout, until it has taken Spec.Ops leases or, if that is zero,
// until its standard input closes. It returns the process's exit code.
func Main() int {
	var s Spec
	if err := json.Unmarshal([]byte(os.Getenv(Env)), &s); err != nil {
		fmt.Fprintln(os.Stderr, "lab worker:", err)
		return 2
	}
	w := &worker{s: s, out: os.Stdout, http: &http.Client{Timeout: 5 * time.Second}}
	client := redis.NewClient(&redis.Options{Addr: s.Redis, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 3 * time.Second})
	defer client.Close()
	if s.Naive {
		w.locker = &naiveLocker{c: client}
	} else {
		l, err := redislock.New(client, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: !s.Sync, Replicas: s.Replicas, Acks: s.Acks}})
		if err != nil {
			fmt.Fprintln(os.Stderr, "lab worker:", err)
			return 2
		}
		w.locker = l
	}
	stop := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(stop) }()
	think := time.NewTimer(0)
	for i := 1; s.Ops == 0 || i <= s.Ops; i++ {
		select {
		case <-stop:
			return 0
		case <-think.C:
		}
		w.op(i)
		think.Reset(s.Think)
	}
	return 0
}

type worker struct {
	s      Spec
	out    io.Writer
	http   *http.Client
	locker fence.Locker
}

func (w *worker) emit(e Event) {
	e.Worker, e.Key, e.Mono = w.s.ID, w.s.Key, Mono()
	_, _ = w.out.Write(e.line())
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// op is one lease: acquire, read the register, append the op id, write it
// back, release.
func (w *worker) op(i int) {
	id := fmt.Sprintf("%s-%d", w.s.ID, i)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w.emit(Event{Op: id, Kind: "acquire", Phase: "invoke"})
	lease, err := w.locker.Acquire(ctx, w.s.Lock, fence.Wait(w.s.Wait), fence.TTL(w.s.TTL))
	if err != nil {
		w.emit(Event{Op: id, Kind: "acquire", Phase: "fail", Err: errString(err)})
		return
	}
	token := int64(lease.Token())
	w.emit(Event{Op: id, Kind: "acquire", Phase: "ok", Token: token})
	pause := slices.Contains(w.s.PauseAt, i)
	if pause && w.s.PausePoint != "read" {
		w.pause(id, token)
	}
	w.emit(Event{Op: id, Kind: "read", Phase: "invoke", Token: token})
	value, phase, err := w.call("read", id, token, nil)
	w.emit(Event{Op: id, Kind: "read", Phase: phase, Token: token, Value: value, Err: errString(err)})
	if phase == "ok" {
		if pause && w.s.PausePoint == "read" {
			w.pause(id, token)
		}
		next := append(value, id)
		w.emit(Event{Op: id, Kind: "write", Phase: "invoke", Token: token, Value: next})
		_, phase, err = w.call("write", id, token, next)
		w.emit(Event{Op: id, Kind: "write", Phase: phase, Token: token, Value: next, Err: errString(err)})
	}
	w.emit(Event{Op: id, Kind: "release", Phase: "invoke", Token: token})
	err = lease.Release(ctx)
	phase = "ok"
	if err != nil {
		phase = "fail"
	}
	w.emit(Event{Op: id, Kind: "release", Phase: phase, Token: token, Err: errString(err)})
}

// pause stops the process until the controller continues it: a GC pause or
// a stalled VM, as far as everyone else can tell. The signal goes to this
// very thread: sent to the process, another thread may take it and this one
// run on for a moment, sending the write the pause was meant to delay.
func (w *worker) pause(id string, token int64) {
	w.emit(Event{Op: id, Kind: "pause", Phase: "invoke", Token: token})
	runtime.LockOSThread()
	_ = unix.Tgkill(os.Getpid(), unix.Gettid(), unix.SIGSTOP)
	runtime.UnlockOSThread()
	w.emit(Event{Op: id, Kind: "pause", Phase: "ok", Token: token})
}

// call sends a read or write to the resource. Its phase is ok (accepted),
// fail (rejected, or certainly not delivered) or unknown (no answer).
func (w *worker) call(kind, id string, token int64, value []string) ([]string, string, error) {
	body, _ := json.Marshal(Request{Op: id, Worker: w.s.ID, Key: w.s.Key, Token: token, Value: value})
	resp, err := w.http.Post("http://"+w.s.Resource+"/"+kind, "application/json", bytes.NewReader(body))
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return nil, "fail", err
		}
		return nil, "unknown", err
	}
	defer resp.Body.Close()
	var out Response
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, "unknown", err
	}
	if !out.Accepted {
		return nil, "fail", errors.New("rejected: stale token")
	}
	return out.Value, "ok", nil
}

// Request is the body of the resource's /read and /write.
type Request struct {
	Op     string   `json:"op"`
	Worker string   `json:"worker"`
	Key    string   `json:"key"`
	Token  int64    `json:"token"`
	Value  []string `json:"value,omitempty"`
}

// Response is the resource's answer to a Request.
type Response struct {
	Accepted bool     `json:"accepted"`
	Value    []string `json:"value,omitempty"`
}

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

func (e Event) line() []byte {
	b, _ := json.Marshal(e)
	return append(b, '\n')
}
