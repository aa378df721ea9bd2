package lab

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/fencekit/fence/cmd/fence/lab/worker"
	"github.com/fencekit/fence/internal/redisserver"
)

// experiment is one run: its servers, workers, resource and history.
type experiment struct {
	ctx       context.Context
	cfg       Config
	dir       string
	protected bool
	res       *Resource
	hist      *History
	note      string // what the fault injection could not do, if anything
	// fenceControl makes the control use fence's lock too (with the
	// scenario's weaker settings) instead of the naive lock.
	fenceControl bool

	stop chan struct{} // closed when the workers have exited

	mu      sync.Mutex
	servers []*redisserver.Server
	workers []*workerProc
	bg      sync.WaitGroup // fault injectors
}

// workerProc is a running worker process.
type workerProc struct {
	id     string
	cmd    *exec.Cmd
	stdin  io.WriteCloser // closing it tells a worker without an op count to stop
	done   chan struct{}
	stderr bytes.Buffer
}

// redis starts a redis-server for this run.
func (x *experiment) redis(extra ...string) (*redisserver.Server, error) {
	dir, err := os.MkdirTemp(x.dir, "redis")
	if err != nil {
		return nil, err
	}
	s, err := redisserver.Start(dir, extra...)
	if err != nil {
		return nil, err
	}
	x.mu.Lock()
	x.servers = append(x.servers, s)
	x.mu.Unlock()
	return s, nil
}

// spawn starts a worker process with spec; its history lines go to x.hist.
func (x *experiment) spawn(s Spec) (*workerProc, error) {
	if len(x.cfg.Worker) == 0 {
		return nil, fmt.Errorf("lab: no worker command configured")
	}
	s.Naive = !x.protected && !x.fenceControl
	body, _ := json.Marshal(s)
	cmd := exec.Command(x.cfg.Worker[0], x.cfg.Worker[1:]...)
	cmd.Env = append(os.Environ(), worker.Env+"="+string(body))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	w := &workerProc{id: s.ID, cmd: cmd, stdin: stdin, done: make(chan struct{})}
	cmd.Stderr = &w.stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var e Event
			if json.Unmarshal(sc.Bytes(), &e) == nil {
				x.hist.add(e)
			}
		}
		_ = cmd.Wait()
	}()
	x.mu.Lock()
	x.workers = append(x.workers, w)
	x.mu.Unlock()
	return w, nil
}

func (w *workerProc) signal(sig syscall.Signal) { _ = w.cmd.Process.Signal(sig) }

// finish tells the worker to stop after its current lease.
func (w *workerProc) finish() { _ = w.stdin.Close() }

// wait waits for the worker to exit, continuing it if it stopped itself.
func (w *workerProc) wait(limit time.Duration) error {
	select {
	case <-w.done:
		if w.cmd.ProcessState != nil && !w.cmd.ProcessState.Success() {
			return fmt.Errorf("worker %s: %v: %s", w.id, w.cmd.ProcessState, w.stderr.String())
		}
		return nil
	case <-time.After(limit):
		_ = w.cmd.Process.Kill()
		<-w.done
		return fmt.Errorf("worker %s still running after %v", w.id, limit)
	}
}

// waitEvent waits until an event matching f is in the history.
func (x *experiment) waitEvent(f func(Event) bool, limit time.Duration) (Event, bool) {
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	seen := 0
	for {
		evs, next := x.hist.snapshot()
		for _, e := range evs[seen:] {
			if f(e) {
				return e, true
			}
		}
		seen = len(evs)
		select {
		case <-next:
		case <-deadline.C:
			return Event{}, false
		case <-x.ctx.Done():
			return Event{}, false
		}
	}
}

// resumeAfterOthersWrite continues every worker that pauses itself once
// another worker's write to the same register has been accepted after the
// pause (or after 5 s, noted as a missed fault), until the workers exit.
func (x *experiment) resumeAfterOthersWrite() {
	x.bg.Add(1)
	go func() {
		defer x.bg.Done()
		seen := 0
		for {
			evs, next := x.hist.snapshot()
			for _, e := range evs[seen:] {
				if e.Kind == "pause" && e.Phase == "invoke" {
					x.bg.Add(1)
					go func() { defer x.bg.Done(); x.resumeLater(e) }()
				}
			}
			seen = len(evs)
			select {
			case <-next:
			case <-x.stop:
				return
			}
		}
	}()
}

func (x *experiment) resumeLater(pause Event) {
	w := x.worker(pause.Worker)
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !x.res.acceptedAfter(pause.Key, pause.Worker, pause.Mono) && time.Now().Before(deadline) {
		<-tick.C
	}
	if time.Now().After(deadline) {
		x.noteOnce("a paused worker was resumed before anyone else wrote")
	}
	if w != nil {
		w.signal(syscall.SIGCONT)
	}
}

func (x *experiment) worker(id string) *workerProc {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, w := range x.workers {
		if w.id == id {
			return w
		}
	}
	return nil
}

func (x *experiment) noteOnce(s string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.note == "" {
		x.note = s
	}
}

// waitWorkers waits for every worker and fault injector to finish.
func (x *experiment) waitWorkers() {
	x.mu.Lock()
	ws := append([]*workerProc(nil), x.workers...)
	x.mu.Unlock()
	for _, w := range ws {
		if err := w.wait(2 * time.Minute); err != nil {
			x.noteOnce(err.Error())
		}
	}
	close(x.stop)
	x.bg.Wait()
}

func (x *experiment) cleanup() {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, w := range x.workers {
		_ = w.cmd.Process.Kill()
		<-w.done
	}
	for _, s := range x.servers {
		s.Kill()
	}
}
