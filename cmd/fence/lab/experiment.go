package lab

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fencekit/fence/cmd/fence/lab/worker"
	"github.com/fencekit/fence/internal/child"
	"github.com/fencekit/fence/internal/etcdserver"
	"github.com/fencekit/fence/internal/redisserver"
	"github.com/fencekit/fence/internal/zkserver"
)

// experiment is one run: its servers, workers, resource and history.
type experiment struct {
	ctx       context.Context
	cfg       Config
	dir       string
	protected bool
	variant   string // the protected row's variant: "" (fence's defaults) or the scenario's stricter one
	res       *Resource
	hist      *History
	note      string // what the fault injection could not do, if anything
	write     string // how protected workers write (worker.WriteGuard unless a test mutates it)
	rng       *rand.Rand
	// interleavings counts where paused workers were resumed.
	interleavings map[string]int
	// verify, if set, checks after the run that the fault took effect,
	// noting it if not.
	verify func()
	// fenceControl makes the control use fence's lock too (with the
	// scenario's weaker settings) instead of the naive lock.
	fenceControl bool
	// pg gives the run a PostgreSQL database (scenario 13, the PostgreSQL
	// rows); queue is scenario 13's verdict, queuePauses the stops it
	// handled.
	pg          *postgresServer
	queue       *queueVerdict
	queuePauses []Event

	stop chan struct{} // closed when the workers have exited

	mu      sync.Mutex
	servers []*redisserver.Server
	zk      []*zkserver.Server
	etcds   []*etcdserver.Cluster
	workers []*workerProc
	bg      sync.WaitGroup // fault injectors
}

// workerProc is a running worker process.
type workerProc struct {
	id     string
	killed atomic.Bool // by the scenario or the lab, on purpose: its exit is no failure
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

// zookeeper starts a standalone ZooKeeper server for this run.
func (x *experiment) zookeeper() (*zkserver.Server, error) {
	dir, err := os.MkdirTemp(x.dir, "zk")
	if err != nil {
		return nil, err
	}
	s, err := zkserver.Start(dir)
	if err != nil {
		return nil, err
	}
	x.mu.Lock()
	x.zk = append(x.zk, s)
	x.mu.Unlock()
	return s, nil
}

// etcd starts a standalone etcd server for this run.
func (x *experiment) etcd() (*etcdserver.Cluster, error) {
	dir, err := os.MkdirTemp(x.dir, "etcd")
	if err != nil {
		return nil, err
	}
	c, err := etcdserver.Start(dir)
	if err != nil {
		return nil, err
	}
	x.mu.Lock()
	x.etcds = append(x.etcds, c)
	x.mu.Unlock()
	return c, nil
}

// spawn starts a worker process with spec; its history lines go to x.hist.
func (x *experiment) spawn(s Spec) (*workerProc, error) {
	if len(x.cfg.Worker) == 0 {
		return nil, fmt.Errorf("lab: no worker command configured")
	}
	s.Naive = !x.protected && !x.fenceControl
	s.Write = worker.WriteNaive
	if x.protected {
		s.Write = x.write
	}
	if s.Resource == "" {
		s.DB = x.res.path
		if s.Key != "" {
			// Before any worker runs: see worker.EnsureRow.
			if err := worker.EnsureRow(x.ctx, x.res.db, s.Key); err != nil {
				return nil, err
			}
		}
	}
	body, _ := json.Marshal(s)
	cmd := exec.Command(x.cfg.Worker[0], x.cfg.Worker[1:]...)
	cmd.Env = append(os.Environ(), worker.Env+"="+string(body))
	child.DieWithParent(cmd)
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
		// A worker that fails is noted as it exits, so that the cause
		// comes first: the others may then wait for a lock nobody takes
		// and note a fault that did not bite (ci88: both other workers
		// had exited on SQLite's busy timeout while the victim was
		// paused, and the note blamed the pause).
		if !cmd.ProcessState.Success() && !w.killed.Load() {
			x.noteOnce(fmt.Sprintf("worker %s: %v: %s", w.id, cmd.ProcessState, strings.TrimSpace(w.stderr.String())))
		}
	}()
	x.mu.Lock()
	x.workers = append(x.workers, w)
	x.mu.Unlock()
	return w, nil
}

func (w *workerProc) signal(sig syscall.Signal) { _ = w.cmd.Process.Signal(sig) }

// kill kills the worker with SIGKILL, on purpose, and waits for it to exit.
func (w *workerProc) kill() {
	w.killed.Store(true)
	_ = w.cmd.Process.Kill()
	<-w.done
}

// finish tells the worker to stop after its current lease.
func (w *workerProc) finish() { _ = w.stdin.Close() }

// wait waits for the worker to exit, continuing it if it stopped itself.
func (w *workerProc) wait(limit time.Duration) error {
	select {
	case <-w.done:
		if w.cmd.ProcessState != nil && !w.cmd.ProcessState.Success() && !w.killed.Load() {
			return fmt.Errorf("worker %s: %v: %s", w.id, w.cmd.ProcessState, w.stderr.String())
		}
		return nil
	case <-time.After(limit):
		w.killed.Store(true) // reported here
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

// resumePoints are where a paused worker may be continued, relative to
// the new holder: the first lease another worker took on the same register
// during the pause. The stale holder then reads (if it had not) and writes
// before, between or after the new holder's read and write.
var resumePoints = []struct{ name, kind, phase string }{
	{"new holder acquired", "acquire", "ok"},
	{"new holder reading", "read", "invoke"},
	{"new holder read", "read", "ok"},
	{"new holder writing", "write", "invoke"},
	{"new holder wrote", "write", ""}, // any outcome
}

// resumeAdversarially continues every worker that pauses itself at a point
// drawn from resumePoints with the run's seeded random source, plus up to
// 2 ms, until the workers exit. A pause during which no other worker took
// the lock within 15 s is a fault that did not bite: it is noted, which
// fails the run. The other workers wait 20 s for the lock and take it
// once the paused holder's lease runs out (200 ms to 1 s, by scenario)
// when the machine is idle; 5 s was too
// short once on a machine with ten runnable jobs for two CPUs (ci74), and
// the bound costs nothing when the fault bites.
func (x *experiment) resumeAdversarially() {
	x.bg.Add(1)
	go func() {
		defer x.bg.Done()
		seen := 0
		for {
			evs, next := x.hist.snapshot()
			for _, e := range evs[seen:] {
				if e.Kind == "pause" && e.Phase == "invoke" {
					// Draw here, in the order of the pauses, so that a seed
					// replays the same choices.
					p, delay := x.draw()
					x.bg.Add(1)
					go func() { defer x.bg.Done(); x.resumeAt(e, p, delay) }()
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

func (x *experiment) draw() (int, time.Duration) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for i, p := range resumePoints {
		if p.name == x.cfg.resumeAt {
			return i, 0
		}
	}
	return x.rng.IntN(len(resumePoints)), time.Duration(x.rng.Int64N(int64(2 * time.Millisecond)))
}

func (x *experiment) resumeAt(pause Event, point int, delay time.Duration) {
	defer func() {
		if w := x.worker(pause.Worker); w != nil {
			w.signal(syscall.SIGCONT)
		}
	}()
	next, ok := x.waitEvent(func(e Event) bool {
		return e.Worker != pause.Worker && e.Key == pause.Key && e.Kind == "acquire" && e.Phase == "ok" && e.Mono > pause.Mono
	}, 15*time.Second)
	if !ok {
		x.noteOnce(fmt.Sprintf("fault did not bite: nobody took the lock while %s was paused (op %s)", pause.Worker, pause.Op))
		return
	}
	p := resumePoints[point]
	_, reached := x.waitEvent(func(e Event) bool {
		return e.Op == next.Op && e.Kind == p.kind && ((p.phase == "" && e.Phase != "invoke") || e.Phase == p.phase)
	}, 500*time.Millisecond)
	name := p.name
	if !reached {
		// The new holder is blocked: the paused worker holds the resource
		// (guard's fenced transaction locks the row until it ends).
		name += " (blocked by the paused holder)"
	}
	x.mu.Lock()
	if x.interleavings == nil {
		x.interleavings = map[string]int{}
	}
	x.interleavings[name]++
	x.mu.Unlock()
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-x.ctx.Done():
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
	// The workers are waited for without x.mu: a worker that fails on its
	// own meanwhile notes it (noteOnce) before it is done, and cleanup
	// waited for it forever (TestCleanupWhileAWorkerFails).
	x.mu.Lock()
	ws := append([]*workerProc(nil), x.workers...)
	x.mu.Unlock()
	for _, w := range ws {
		w.kill()
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, s := range x.servers {
		s.Kill()
	}
	for _, s := range x.zk {
		s.Kill()
	}
	for _, c := range x.etcds {
		c.Close()
	}
}
