// Package lab is fence's fault lab: it runs the article's failures against
// real redis-server processes, with workers in separate processes (so that a
// signal pauses exactly one client), a resource as users ship it (guard over
// a SQLite database, in scenario 3 also in PostgreSQL, and guard's HTTP
// middleware where the scenario has a network hop) whose log table, written in the same transaction as each
// write, is the ground truth, and a checker that judges each run.
//
// Every scenario runs as a control, which must show the violation, proving
// the checker can see it, and protected, which must show none. The control
// is the naive lock (SET NX PX with an INCR counter for tokens, no replica
// sync) with the row read and then written with a plain UPDATE; in 5 fence's
// lock with its defaults, in 12 with replica sync off, in 7 and 8 fence's
// redlock with its defaults, in 10 and 11 the etcd and ZooKeeper locks with
// writes that ignore tokens; 9's is the naive lock paused inside Acquire,
// which must hand out a lease that expired during the pause; 13's is the
// queue example's consumer (examples/queue) with a plain transaction and
// no unique constraint on the message id, whose protected row is the
// consumer as the example ships it. Protected is
// the backend with its defaults (redislock.New(client, nil); redlock over
// independent redis-servers in 7–9; etcdlock in 10, zklock in 11) and
// guard's fenced read-modify-write. Some scenarios add a protected row with
// a different setting. A run whose fault did not take effect fails.
package lab

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/fencekit/fence/cmd/fence/lab/worker"
	"github.com/fencekit/fence/internal/nilctx"
)

// Config of a lab run.
type Config struct {
	// Worker is the command that starts a worker process; the lab sets
	// worker.Env in its environment. Empty means the labworker command,
	// which Run builds with BuildWorker into a temp dir.
	Worker []string
	// Quick runs a short version of every scenario (CI); otherwise each
	// protected run makes at least 200 fenced writes.
	Quick bool
	// Scenarios to run, by number; empty runs all.
	Scenarios []int
	// Progress, if set, receives a line per run as it finishes.
	Progress io.Writer
	// Seed seeds the adversarial timing (where paused workers resume); 0
	// picks one at random. The report prints it: run again with it to
	// replay the same choices.
	Seed uint64
	// write is how protected workers do their read-modify-write:
	// worker.WriteGuard unless a test mutates it.
	write string
	// syncOff turns replica sync off in scenario 12's protected rows: for
	// the mutation test.
	syncOff bool
	// skipFault leaves out the fault of the Redlock scenarios (7–9), so
	// that a test sees the run fail as one whose fault did not bite.
	skipFault bool
	// dropUnique drops the unique constraint on the message id in
	// scenario 13's protected rows: for the mutation test.
	dropUnique bool
	// resumeAt, if set, names the resume point of every pause (see
	// resumePoints) instead of a random one: for tests.
	resumeAt string
	// rows, if set, names the rows to run (control, protected, or
	// "protected, "+variant); the others are left out: for tests that
	// look at some rows only.
	rows []string
}

// Result is one scenario under one configuration.
type Result struct {
	Scenario  int     `json:"scenario"`
	Name      string  `json:"name"`
	Config    string  `json:"config"` // control, protected (fence's defaults), or a stricter variant
	Verdict   Verdict `json:"verdict"`
	Seconds   float64 `json:"seconds"`
	Expect    string  `json:"expect"` // what the run had to show
	Pass      bool    `json:"pass"`
	FaultNote string  `json:"fault_note,omitempty"` // a fault that did not take effect: the run fails
	// Interleavings counts where paused workers were resumed, relative to
	// the new holder's lease.
	Interleavings map[string]int `json:"interleavings,omitempty"`
	timeline      *timeline
}

// scenario is one of LAB.md's fault scenarios.
type scenario struct {
	n       int
	name    string
	control string                  // the property the control must violate
	run     func(*experiment) error // injects the fault while workers run
	// variants are protected rows beside fence's defaults.
	variants []string
}

var scenarios = []scenario{
	{1, "paused holder", "P1", pausedHolder("acquired"), nil},
	{2, "delayed write", "P1", delayedWrite, nil},
	{3, "lost update", "P3", pausedHolder("read"), []string{rowPostgres}},
	{4, "async failover", "P1", asyncFailover, []string{"replica unseen"}},
	{5, "wrong replica promoted", "P1", wrongReplica, []string{"acks=all"}},
	{6, "token source loss", "P2", tokenSourceLoss, nil},
	{7, "Redlock node restart", "P1", redlockRestart, nil},
	{8, "Redlock clock jump", "P1", redlockClockJump, nil},
	{9, "pause during acquisition", "validity", pausedAcquisition, nil},
	{10, "etcd lease expiry", "P1", etcdLeaseExpiry, nil},
	{11, "ZooKeeper session expiry", "P1", zkSessionExpiry, nil},
	{12, "Sentinel failover", "P1", sentinelFailover, nil},
	{QueueScenario, "single active consumer", "P3", singleConsumer, nil},
}

// Run runs the scenarios and returns the report. It returns an error if a
// scenario could not be set up; a control that shows no violation, or a
// protected run that shows one, is reported as a failed Result.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if ctx == nil {
		return newReport(cfg.Quick), nilctx.Err("lab", "Run")
	}
	if err := CheckScenarios(cfg.Scenarios); err != nil {
		return newReport(cfg.Quick), err
	}
	if cfg.Seed == 0 {
		cfg.Seed = rand.Uint64()
	}
	if cfg.write == "" {
		cfg.write = worker.WriteGuard
	}
	rep := newReport(cfg.Quick)
	rep.Seed = cfg.Seed
	if len(cfg.Worker) == 0 {
		dir, err := os.MkdirTemp("", "fence-lab-worker-")
		if err != nil {
			return rep, err
		}
		defer os.RemoveAll(dir)
		start := time.Now()
		bin, err := BuildWorker(ctx, dir)
		if err != nil {
			return rep, err
		}
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "built the worker in %.1fs\n", time.Since(start).Seconds())
		}
		cfg.Worker = []string{bin}
	}
	pg := &postgresServer{}
	defer pg.close()
	for _, sc := range scenarios {
		if len(cfg.Scenarios) > 0 && !contains(cfg.Scenarios, sc.n) {
			continue
		}
		rows := []string{"control", "protected"}
		for _, v := range sc.variants {
			rows = append(rows, "protected, "+v)
		}
		for i, row := range rows {
			if len(cfg.rows) > 0 && !slices.Contains(cfg.rows, row) {
				continue
			}
			res, err := runOne(ctx, cfg, pg, sc, i, row)
			if err != nil {
				return rep, fmt.Errorf("scenario %d (%s): %w", sc.n, sc.name, err)
			}
			rep.Results = append(rep.Results, res)
			if cfg.Progress != nil {
				fmt.Fprintln(cfg.Progress, res.line())
			}
		}
	}
	return rep, nil
}

// CheckScenarios returns an error naming the first of ns that is not one
// of the lab's scenarios, so that a mistyped --scenario is refused before
// anything runs, rather than run nothing and fail as a run that showed no
// violation.
func CheckScenarios(ns []int) error {
	for _, n := range ns {
		if !slices.ContainsFunc(scenarios, func(sc scenario) bool { return sc.n == n }) {
			return fmt.Errorf("no scenario %d: the scenarios are %d to %d", n, scenarios[0].n, scenarios[len(scenarios)-1].n)
		}
	}
	return nil
}

func contains(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// runOne runs row i of sc: 0 is the control, 1 protected with fence's
// defaults, then the scenario's variants.
func runOne(ctx context.Context, cfg Config, pg *postgresServer, sc scenario, i int, row string) (Result, error) {
	protected := i > 0
	dir, err := os.MkdirTemp("", fmt.Sprintf("fence-lab-%d-", sc.n))
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(dir)
	var dsn string
	var pgStart time.Duration
	if i > 1 && sc.variants[i-2] == rowPostgres {
		// The server starts once per lab run, in the first PostgreSQL
		// row, whose seconds include its start.
		t0 := time.Now()
		if dsn, err = pg.database(ctx); err != nil {
			return Result{}, err
		}
		pgStart = time.Since(t0)
	}
	res, err := startResource(ctx, dir, dsn, protected)
	if err != nil {
		return Result{}, err
	}
	defer res.close()
	x := &experiment{ctx: ctx, cfg: cfg, dir: dir, protected: protected, pg: pg, write: cfg.write, res: res, hist: newHistory(), stop: make(chan struct{}),
		rng: rand.New(rand.NewPCG(cfg.Seed, uint64(sc.n*16+i)))}
	if i > 1 {
		x.variant = sc.variants[i-2]
	}
	defer x.cleanup()
	start := time.Now()
	if err := sc.run(x); err != nil {
		return Result{}, err
	}
	x.waitWorkers()
	if x.verify != nil {
		x.verify()
	}
	r := Result{Scenario: sc.n, Name: sc.name, Config: row, Seconds: (time.Since(start) + pgStart).Seconds(), FaultNote: x.note, Interleavings: x.interleavings}
	events := x.hist.Events()
	log, err := res.Log()
	if err != nil {
		return r, fmt.Errorf("reading the resource's log: %w", err)
	}
	state, err := res.State()
	if err != nil {
		return r, fmt.Errorf("reading the resource's state: %w", err)
	}
	r.Verdict = Check(events, log, state)
	if x.queue != nil {
		x.queue.fill(&r.Verdict)
	}
	r.Verdict.Retried = retried(events)
	r.Verdict.P5, r.Verdict.P5Histories = checkLinearizable(events)
	r.timeline = &timeline{events: events, log: log}
	r.Expect, r.Pass = judge(protected, sc.control, r.Verdict, r.FaultNote)
	return r, nil
}

// judge says what a run had to show and whether it did: a control must
// violate its property, a protected run none; a run whose fault did not
// take effect (note) proves nothing either way and fails.
func judge(protected bool, control string, v Verdict, note string) (expect string, pass bool) {
	if protected {
		expect = "P1 = P2 = P3 = 0, P5 Ok"
		if control == "validity" {
			expect = "expired grants = 0, P1 = P2 = P3 = 0, P5 Ok"
		}
		pass = v.P1 == 0 && v.P2 == 0 && v.P3 == 0 && v.Expired == 0 && v.P5 == "Ok" && v.Ops > 0
		if v.Messages > 0 {
			// The queue (13): each message once, and the deposed
			// consumer's late commit rejected by the fence, not merely
			// made a no-op by the unique constraint.
			expect = "P3 = 0 (each message applied once), late commits rejected > 0"
			pass = pass && v.Rejected > 0
		}
	} else {
		expect = control + " > 0"
		if v.Messages > 0 {
			expect = "P3 > 0 (messages applied twice or never)"
		}
		if control == "validity" {
			expect = "expired grants > 0 (no validity check)"
		}
		pass = v.get(control) > 0
	}
	return expect, pass && note == ""
}

func (v Verdict) get(p string) int {
	switch p {
	case "P1":
		return v.P1
	case "P2":
		return v.P2
	case "P3":
		return v.P3
	case "validity":
		return v.Expired
	}
	return 0
}

// Spec tells a worker process what to do.
type Spec = worker.Spec

// WorkerPackage is the import path of the labworker command, which runs
// worker.Main.
const WorkerPackage = "github.com/fencekit/fence/cmd/fence/lab/cmd/labworker"

// BuildWorker builds the labworker command into dir with the go command and
// returns the binary's path. It needs the go command on the PATH and fence's
// source as the current module, as when the lab runs from a checkout with
// `go run ./cmd/fence lab`.
func BuildWorker(ctx context.Context, dir string) (string, error) {
	if ctx == nil {
		return "", nilctx.Err("lab", "BuildWorker")
	}
	bin := filepath.Join(dir, "labworker")
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, WorkerPackage).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("lab: building the worker (go build %s) needs the go command, run from a checkout of fence: %w\n%s", WorkerPackage, err, out)
	}
	return bin, nil
}
