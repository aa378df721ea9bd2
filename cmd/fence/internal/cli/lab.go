package cli

import (
	"errors"
	"fmt"
	"github.com/fencekit/fence/cmd/fence/internal/progress"
	"os"
	"path/filepath"

	"github.com/fencekit/fence/cmd/fence/lab"
	"github.com/spf13/cobra"
)

func labCmd() *cobra.Command {
	var quick bool
	var seed uint64
	var only []int
	var out string
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "Run the fault lab: the article's failures on real redis-server processes, judged by a checker",
		Long: `Lab runs fence's fault scenarios against real redis-server processes (it needs redis-server
on the PATH), with each worker in its own process, a resource that logs what it accepted and
rejected, and a checker that judges each run:

  P1  no stale accept: no read or write accepted with a token below one already accepted
  P2  token order: a lease acquired after another completed has a greater token
  P3  nothing lost, nothing doubled: acknowledged writes are in the final state exactly once
  P4  lease overlap: how often two leases believed they held the lock (a figure, not a verdict)
  P5  linearizability of the workers' client-side histories (porcupine): the register, each
      lease's read-modify-write as one atomic update, the tokens: Ok, Illegal or Unknown

Scenarios: 1 paused holder, 2 delayed write (through an in-process toxiproxy), 3 lost
update, 4 async failover, 5 wrong replica promoted, 6 token source loss; on fence's redlock
over independent masters, 7 Redlock node restart (5 nodes; A holds a majority, one of its
nodes restarts empty, B is granted a majority too), 8 Redlock clock jump (5 nodes,
toxiproxy links, a partition, and PEXPIRE on one node's lock key standing in for its clock
jumping), 9 pause during acquisition (3 nodes; the worker stops itself after the nodes
granted, before the lock has read the last reply, past the lease: redlock must refuse by
its validity check); 10 etcd lease expiry and 11 ZooKeeper session expiry (etcdlock and
zklock on servers the lab starts: a holder paused past its lease); 12 Sentinel failover
(scenario 4's fault, the replica promoted by three redis-sentinel processes, the workers
connected through them); 13 single active consumer (examples/queue's consumer under
fence.Lead, effects in PostgreSQL: the leader stopped mid-message past its lease and
continued after the other took over with XAUTOCLAIM, then the new leader stopped inside its
transaction, then the active one SIGKILLed; P3 counts messages applied twice or never).

Each runs as a control, which must show the violation, and protected, which must show none:
the backend with its defaults (redislock.New(client, nil), redlock.New(clients, nil),
etcdlock, zklock) and the resource behind guard (a SQLite row written with guard.Tx, fenced
first, then read, then written; guard.Middleware in scenario 2); scenario 3 adds the same
row in PostgreSQL (guard.Tx over pgx, a server the lab starts with initdb). Rows with a
stricter or weaker setting (acks=all, a replica never seen) show which safety came from the
lock and which from the token. The control is a naive lock (SET NX PX with an INCR token, no
replica sync) and a plain read-then-UPDATE; in 5 fence's lock with its defaults, in 12 with
replica sync off, in 7 and 8 fence's redlock with its defaults (the two holders are
Redlock's own), in 10 and 11 the etcd and ZooKeeper locks with writes that ignore tokens;
in 9 the naive lock paused the same way, which hands out a lease that expired during the
pause; in 13 the queue's consumer without the fence and without the unique constraint on
the message id (its protected row must also show a late commit rejected). A fault that did not take effect fails its run. Paused workers resume at seeded
random points (--seed replays them).
Each run prints a line to stderr as it finishes; when stderr is a terminal, a status line
beneath them shows the time elapsed (rewritten in place, cleared at the end).
Lab exits 1 if an expectation fails, and 2 on a usage error (an unknown --scenario, an --out
it cannot write to), before anything runs, or when a scenario could not be set up (its worker
is built with the go command from a checkout of fence; a server that did not start): then
nothing was judged.

--quick runs a short version (about 2 min: PostgreSQL's row about 4 s, the Redlock
scenarios about 7 s, etcd's and ZooKeeper's about 17 s each, the Sentinel failovers about
11 s, the single active consumer's two rows about 10 s with 200 messages); the full run
(18 min on a loaded machine) makes at least 200 fenced writes per scenario (2,000 messages
in 13). With --out DIR it writes report.md, report.json and timeline.svg there, and
timeline-N.svg per scenario: one round zoomed in, the control above the protected rows.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Usage errors before the run, not after it: a mistyped
			// --scenario ran nothing and failed as a run whose control
			// showed no violation, and an --out that cannot be written
			// failed only once the whole run (17 min) was over.
			if err := lab.CheckScenarios(only); err != nil {
				return exitWith(ExitUsage, fmt.Errorf("--scenario: %w", err))
			}
			if out != "" {
				if err := checkOutDir(out); err != nil {
					return exitWith(ExitUsage, fmt.Errorf("--out: %w", err))
				}
			}
			stderr := cmd.ErrOrStderr()
			running := progress.Start(stderr, stderrIsTerminal(stderr), "fence lab: running")
			restore := libLog.divert(running) // go-redis's log lines beneath the status line, not after it
			rep, err := lab.Run(cmd.Context(), lab.Config{Quick: quick, Scenarios: only, Progress: running, Seed: seed})
			restore()
			running.Stop()
			if err != nil {
				// A scenario that could not be set up (no go command or
				// checkout to build the worker, a server that did not
				// start) judged nothing: exit 1 would tell a script that
				// an expectation failed, that the lab found a violation.
				return exitWith(ExitUsage, err)
			}
			rep.Markdown(cmd.OutOrStdout())
			if out != "" {
				if err := writeReport(rep, out); err != nil {
					return exitWith(1, err)
				}
			}
			if !rep.Passed() {
				return exitWith(1, errors.New("lab: a control showed no violation or a protected run showed one"))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&quick, "quick", false, "run the short version of every scenario")
	cmd.Flags().Uint64Var(&seed, "seed", 0, "seed of the adversarial timing (0: random; the report prints it)")
	cmd.Flags().IntSliceVar(&only, "scenario", nil, "run only these scenarios (by number; default all)")
	cmd.Flags().StringVar(&out, "out", "", "directory to write report.md, report.json and timeline.svg to")
	return cmd
}

// checkOutDir makes dir, if it does not exist, and checks that a file can
// be created in it.
func checkOutDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".fence-lab-check-")
	if err != nil {
		return err
	}
	return errors.Join(f.Close(), os.Remove(f.Name()))
}

func writeReport(rep *lab.Report, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	files := map[string]func(f *os.File) error{
		"report.md":   func(f *os.File) error { rep.Markdown(f); return nil },
		"report.json": func(f *os.File) error { return rep.JSON(f) },
		"timeline.svg": func(f *os.File) error {
			if !rep.Timeline(f) {
				return fmt.Errorf("no control run to draw")
			}
			return nil
		},
	}
	for _, res := range rep.Results {
		if res.Scenario == lab.QueueScenario {
			continue // no lease-by-lease round to zoom into
		}
		files[fmt.Sprintf("timeline-%d.svg", res.Scenario)] = func(f *os.File) error {
			if !rep.Zoomed(f, res.Scenario) {
				return fmt.Errorf("no round of scenario %d to draw", res.Scenario)
			}
			return nil
		}
	}
	for name, write := range files {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		err = errors.Join(write(f), f.Close())
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}
