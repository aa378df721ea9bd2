package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/fencekit/fence"
	"github.com/spf13/cobra"
)

// releaseTimeout bounds the release after the child has exited.
const releaseTimeout = 5 * time.Second

func execCmd() *cobra.Command {
	var rf redisFlags
	var wait, ttl, grace time.Duration
	cmd := &cobra.Command{
		Use:   "exec NAME -- COMMAND [ARG...]",
		Short: "Run a command while holding a lock",
		Long: `Exec acquires the lock called NAME, runs COMMAND while holding it, and releases it when the
command exits, in the manner of "etcdctl lock" and "consul lock".

It waits up to --wait for the lock (default 0: try once). Without --ttl the lease lasts
--watchdog-ttl (default 30s) and a watchdog renews it every third of that until the command
exits; with --ttl the lease is not renewed and ends after that time.

The command gets FENCE_TOKEN (the fencing token of this acquisition) and FENCE_LOCK (the lock
name) in its environment. Pass FENCE_TOKEN with every write the command makes, and have the
resource reject tokens lower than one it has already accepted: a lease can be lost while the
command runs.

The command runs in its own process group. If the lease is lost (the lock expired, was
removed, or could not be renewed in time), exec sends SIGTERM to the group, waits --grace
(default 10s), then sends SIGKILL. SIGINT, SIGTERM and SIGHUP sent to exec are passed on to
the group.

Exit status: the command's own (128 + the signal number if a signal ended it); 75 if the lock
was not acquired within --wait (or too few replicas confirmed it); 76 if the lease was lost
while the command ran; 127 if the command could not be started; 130 if exec was interrupted
while waiting for the lock; 2 on a usage or connection error.`,
		Example: `  fence exec --wait 2s --ttl 10s lock:payment:1001 -- ./approve-payment 1001
  FENCE_REDIS_URL=redis://:secret@redis:6379 fence exec nightly-report -- sh -c 'make-report --token "$FENCE_TOKEN"'`,
		Args: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 || len(args) < 2 {
				return exitWith(ExitUsage, errors.New("usage: fence exec [flags] NAME -- COMMAND [ARG...]"))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if grace < 0 {
				return exitWith(ExitUsage, fmt.Errorf("--grace must not be negative, got %v", grace))
			}
			opts := []fence.Option{fence.Wait(wait)}
			if cmd.Flags().Changed("ttl") {
				opts = append(opts, fence.TTL(ttl))
			}
			l, closeClient, err := rf.locker()
			if err != nil {
				return err
			}
			defer closeClient()
			lease, err := l.Acquire(cmd.Context(), args[0], opts...)
			if err != nil {
				return acquireError(err)
			}
			return runHolding(cmd, lease, args[1:], grace)
		},
	}
	rf.register(cmd)
	cmd.Flags().DurationVar(&wait, "wait", 0, "how long to wait for the lock; 0 tries once")
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "fixed lease time, not renewed; without it the watchdog renews the lease")
	cmd.Flags().DurationVar(&grace, "grace", 10*time.Second, "after SIGTERM on a lost lease, how long to wait before SIGKILL")
	return cmd
}

// runHolding runs argv while lease is held and releases it afterwards.
func runHolding(cmd *cobra.Command, lease fence.Lease, argv []string, grace time.Duration) error {
	stderr := cmd.ErrOrStderr()
	release := func() error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(cmd.Context()), releaseTimeout)
		defer cancel()
		return lease.Release(ctx)
	}
	child := exec.Command(argv[0], argv[1:]...)
	// fence's credentials stay with fence: FENCE_REDIS_URL and its kind
	// are not passed on (a fence inside the command needs its own).
	child.Env = append(childEnv(os.Environ()),
		"FENCE_TOKEN="+strconv.FormatInt(int64(lease.Token()), 10),
		"FENCE_LOCK="+lease.Name())
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, cmd.OutOrStdout(), stderr
	// Its own process group, so that a lost lease stops everything it started.
	child.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	if err := child.Start(); err != nil {
		return exitWith(127, errors.Join(err, release()))
	}
	exited := make(chan struct{})
	go func() { _ = child.Wait(); close(exited) }()

	group := -child.Process.Pid
	leaseDone := lease.Done()
	var kill <-chan time.Time
	var lost error
	for {
		select {
		case <-exited:
			relErr := release()
			if lost == nil && errors.Is(relErr, fence.ErrLeaseLost) {
				lost = relErr
			}
			if lost != nil {
				return exitWith(ExitLeaseLost, fmt.Errorf("lease on %q lost while the command ran: %w", lease.Name(), lost))
			}
			if relErr != nil {
				fmt.Fprintln(stderr, "fence: release:", relErr)
			}
			if code := exitCode(child.ProcessState); code != 0 {
				return exitWith(code, nil)
			}
			return nil
		case <-leaseDone:
			leaseDone = nil
			lost = lease.Err()
			fmt.Fprintf(stderr, "fence: lease on %q lost (%v); sending SIGTERM to the command\n", lease.Name(), lost)
			_ = syscall.Kill(group, syscall.SIGTERM)
			kill = time.After(grace)
		case <-kill:
			fmt.Fprintf(stderr, "fence: the command is still running %v after SIGTERM; sending SIGKILL\n", grace)
			_ = syscall.Kill(group, syscall.SIGKILL)
		case s := <-sigs:
			_ = syscall.Kill(group, s.(syscall.Signal))
		}
	}
}

// exitCode is the child's exit status as a shell reports it.
func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
