package cli

import (
	"context"
	"errors"
	"fmt"
	"github.com/fencekit/fence/cmd/fence/internal/progress"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/pause"
	"github.com/fencekit/fence/redislock"
	"github.com/spf13/cobra"
)

// releaseTimeout bounds the release after the child has exited, its
// retries included.
const releaseTimeout = 5 * time.Second

func execCmd() *cobra.Command {
	var lf lockerFlags
	var wait, ttl, grace time.Duration
	cmd := &cobra.Command{
		Use:   "exec NAME -- COMMAND [ARG...]",
		Short: "Run a command while holding a lock",
		Long: `Exec acquires the lock called NAME, runs COMMAND while holding it, and releases it when the
command exits, in the manner of "etcdctl lock" and "consul lock".

It waits up to --wait for the lock (default 0: try once). On Redis, a server that does not
answer ends the wait with exit status 2 at most 2.5s after --wait (counted from 1.1s, room for
a first try's WAIT for replicas, when --wait is shorter than that): the acquisition gives up 1s
after --wait, then exec waits up to 1s to give back a lock that the unanswered try may have
taken, and up to 0.5s for the client to close. With --wait 0 the one try is bounded by the
client's timeouts (the URL's dial_timeout and read_timeout; a Sentinel's master lookup takes
longer), and the same 1.5s follow.

Without --ttl the lease lasts --watchdog-ttl (default 30s) and a watchdog renews it every
third of that until the command exits; with --ttl the lease is not renewed and ends after that
time.

The command gets FENCE_TOKEN (the fencing token of this acquisition) and FENCE_LOCK (the lock
name) in its environment. Pass FENCE_TOKEN with every write the command makes, and have the
resource reject tokens lower than one it has already accepted: a lease can be lost while the
command runs.

The command runs in its own process group. If the lease is lost (the lock expired, was
removed, or could not be renewed in time), exec sends SIGTERM to the group, waits --grace
(default 10s), then sends SIGKILL. When the command exits, whatever it left running (its
background jobs, and processes that left the group by double-forking, which come back to
exec while it runs) gets the same SIGTERM, then SIGKILL after --grace, and the lock is
released only when none is left; a release that fails without a conclusion (a link that
broke) is retried for up to 5s. SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 sent to exec
are passed on to the group.

On a terminal (stdin is exec's terminal and exec runs in its foreground) the command's
group is made the terminal's foreground group, so the command can read the terminal and
gets ^C and ^Z itself; in the background it would be stopped by SIGTTIN while the lock stayed
held. (Not creating a group on a terminal would also work, but then exec could not end the
command's background processes without ending itself.) ^Z stops the command and then exec
itself, so that the shell gets the terminal back; fg resumes both. A stopped exec renews
nothing: after --watchdog-ttl the lease is lost, and on resuming the command is stopped.

The command's parent is exec itself, re-executed as a small process in the command's group
(shown as "fence: exec shim"); it passes the command's exit status on unchanged. When exec
dies, even by SIGKILL, that process ends the command's group: SIGTERM, then SIGKILL after
--grace. This holds for a command that changes its user or group at exec (set-user-ID or
set-group-ID, such as sudo or su) too, for which the kernel drops a death signal: as root
exec may signal it, and as another user while the program keeps that user as its real user
(sudo does, and passes the signal on). What left the group (by double-forking) then runs on.

Instead of one Redis, the lock can come from:
  --redlock URL,URL,URL (or FENCE_REDLOCK_URLS): Redlock on a majority of independent Redis
      masters; see the README for when that is worth it.
  --etcd URL[,URL...] (or FENCE_ETCD_ENDPOINTS): an etcd cluster; the token is the lock
      key's create revision.
  --zookeeper HOST:PORT[,HOST:PORT...] (or FENCE_ZOOKEEPER_SERVERS): ZooKeeper; the token is
      the lock node's creation zxid, and a lease without --ttl lasts as long as the session
      (--zookeeper-session-timeout, default 10s, after the last contact); --ttl ends it
      sooner by deleting the node.

The command does not inherit FENCE_REDIS_URL, FENCE_REDIS_SENTINEL_URL,
FENCE_REDIS_CLUSTER_URL, FENCE_REDLOCK_URLS, FENCE_ETCD_ENDPOINTS or other FENCE_ variables
named like URLs, DSNs or passwords; a fence inside it needs its own. Passwords are shown
masked, in help and in errors.

While exec waits for the lock (--wait) with stderr a terminal, a status line shows how long
it has waited, cleared when the lock is granted; otherwise it writes nothing of its own while
waiting but go-redis's log lines (a Sentinel client's notes on the master it found) and the
first dial that failed, if the server cannot be reached.

--acks and --replicas choose how many replicas must confirm an acquisition or renewal with
WAIT within 1s: --acks a number, majority (of the expected replicas) or all; --replicas the number the
primary is expected to have (0: read from it). A bad value exits 2.

Exit status: the command's own (128 + the signal number if a signal ended it); 75 if the lock
was not acquired within --wait (or too few replicas confirmed it); 76 if the lease was lost
while the command ran, or before it started (it is then not started); 127 if the command could not be started; 130 if exec was interrupted
while connecting or waiting for the lock, or before the command started; 2 on a usage or connection error, or a bad flag value (a --ttl
below the library's minimum lease time included).`,
		Example: `  fence exec --wait 2s --ttl 10s lock:payment:1001 -- ./approve-payment 1001
  FENCE_REDIS_URL=redis://:secret@redis:6379 fence exec nightly-report -- sh -c 'make-report --token "$FENCE_TOKEN"'
  fence exec --etcd http://127.0.0.1:2379 --wait 5s leader:billing -- ./billing-leader`,
		Args: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 || len(args) < 2 {
				return exitWith(ExitUsage, errors.New("usage: fence exec [flags] NAME -- COMMAND [ARG...]"))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			keepWritingOnBrokenPipe()
			if err := validateDurations(wait, ttl, cmd.Flags().Changed("ttl"), grace, lf.redis.watchdogTTL); err != nil {
				return exitWith(ExitUsage, err)
			}
			opts := []fence.Option{fence.Wait(wait)}
			if cmd.Flags().Changed("ttl") {
				opts = append(opts, fence.TTL(ttl))
			}
			l, closeClient, err := lf.locker(cmd)
			if err != nil {
				return err
			}
			defer closeClient()
			actx, cancel := acquireContext(cmd.Context(), l, wait)
			defer cancel()
			lease, err := acquireShowing(actx, cmd.ErrOrStderr(), l, args[0], wait, opts)
			if err != nil {
				if _, ok := l.(*redislock.Locker); ok {
					err = lf.redis.tlsHint(cmd.Context(), err)
				}
				return acquireError(noAnswerWithin(err, actx, cmd.Context(), wait))
			}
			return runHolding(cmd, lease, args[1:], grace)
		},
	}
	lf.register(cmd)
	cmd.Flags().DurationVar(&wait, "wait", 0, "how long to wait for the lock; 0 tries once")
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "fixed lease time, not renewed; without it the watchdog renews the lease")
	cmd.Flags().DurationVar(&grace, "grace", 10*time.Second, "after SIGTERM (on a lost lease, or to what the command left running when it exited), how long to wait before SIGKILL")
	return cmd
}

// keepWritingOnBrokenPipe makes a write to a closed pipe on stdout or
// stderr an EPIPE error instead of the SIGPIPE that Go's runtime otherwise
// dies of (for fds 1 and 2 only). exec writes to stderr at the moments it
// must not die: "lease lost; sending SIGTERM" before it ends the command's
// group, "sending SIGKILL" before it ends a leftover and releases the lock,
// and its exit status line. With stderr a pipe whose reader had gone
// (2>&1 | logger, the logger dead), fence died there: the command's
// background processes ran on with a lost lease, or with the lock held by
// nobody until its TTL, and the caller got a death by signal instead of
// 76 or the command's status (TestExecLostLeaseStderrClosed,
// TestExecLeftoverStderrClosed). Caught with Notify, not ignored: an
// ignored SIGPIPE would be inherited by the command, and the kernel resets
// a caught one to its default at execve (TestExecChildStillGetsSIGPIPE).
// Never stopped: Main prints the last line after RunE returns.
func keepWritingOnBrokenPipe() {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
}

// acquireShowing takes the lock called name; with a wait budget and stderr a
// terminal, it shows that it waits on a status line, cleared when Acquire
// returns. Otherwise it writes nothing but the first dial failure while
// it waits (see dialNoise).
func acquireShowing(ctx context.Context, stderr io.Writer, l fence.Locker, name string, wait time.Duration, opts []fence.Option) (fence.Lease, error) {
	if wait <= 0 {
		return l.Acquire(ctx, name, opts...)
	}
	defer libLog.waitingForLock()()
	if !stderrIsTerminal(stderr) {
		return l.Acquire(ctx, name, opts...)
	}
	waiting := progress.Start(stderr, true, fmt.Sprintf("fence: waiting for %q", name))
	defer waiting.Stop()
	// Runs before Stop: a library's log line while waiting (go-redis
	// failing to dial) clears the status line and starts a line of its own.
	defer libLog.divert(waiting)()
	return l.Acquire(ctx, name, opts...)
}

// waitOverrun is how long past --wait exec lets a Redis Acquire run
// before it gives up on the server (see acquireContext): room for the
// round trips of a first try that is slow but answered, and short enough
// that a server that never answers costs --wait and a little more.
const waitOverrun = time.Second

// firstTryAnswer is how long an answered first try may wait on Redis for
// replicas: exec leaves ReplicaSync.Timeout at redislock's default, 1 s at
// most, and Redis answers a WAIT that timed out up to a clock tick (100 ms)
// later. A --wait shorter than that still gives the first try this long
// (and waitOverrun more): with a deadline at --wait + 1 s, a first try on a
// free lock whose replica lagged, answered by Redis with too few
// acknowledgements (exit 75) after 1.1 s, was cut off into exit 2 "no
// answer from Redis" for a --wait of 100 ms or less
// (TestExecShortWaitLaggingReplica).
const firstTryAnswer = time.Second + 100*time.Millisecond

// acquireContext is the context of exec's Acquire. With --wait, on Redis
// (redislock), it ends waitOverrun after the wait, or after firstTryAnswer
// when the wait is shorter: redislock bounds the
// waiting, and the tries after the first, by the wait budget, but its first
// try by the context only, and exec's has no deadline; so a Redis that
// accepts connections and never answers held exec for go-redis's own
// timeouts (5 s with its defaults), a hung Sentinel for its lookups (25 s).
// The budget ends first, so a lock held throughout is still ErrHeld (exit
// 75); the deadline makes a connection error (exit 2).
//
// Not for the other backends. Redlock bounds its tries by the wait budget
// itself (a first try is bounded by its per-node timeouts when it cannot
// outlast the budget), and a deadline on its Acquire broke what it does
// within them: with two of three nodes refusing connections, go-redis's
// dial retries outlasted the deadline and the "no quorum" error was lost,
// and a hung node's requests, cut short, were left for Close to report.
// Nor without --wait: the one try is bounded by the client's timeouts, as
// before (the URL's dial_timeout, read_timeout, ...).
func acquireContext(ctx context.Context, l fence.Locker, wait time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := l.(*redislock.Locker); !ok || wait <= 0 || wait > math.MaxInt64-waitOverrun {
		// (Past the largest duration, a deadline would overflow into
		// one that has passed.)
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, max(wait, firstTryAnswer)+waitOverrun)
}

// noAnswerWithin says, of an Acquire that acquireContext's deadline ended
// (not the caller's ctx, not the budget: that is ErrHeld), that the server
// did not answer in time.
func noAnswerWithin(err error, actx, ctx context.Context, wait time.Duration) error {
	if errors.Is(actx.Err(), context.DeadlineExceeded) && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w (no answer from Redis within %v: --wait %v and %v more)", err, max(wait, firstTryAnswer)+waitOverrun, wait, max(wait, firstTryAnswer)+waitOverrun-wait)
	}
	return err
}

// validateDurations checks exec's durations before fence connects
// anywhere: nothing negative, and lease times (--ttl, --watchdog-ttl) that
// the library accepts (fence.ValidateTTL; the errors match
// fence.ErrInvalidOption). pflag has already refused what time.ParseDuration
// refuses, overflow included.
func validateDurations(wait, ttl time.Duration, ttlSet bool, grace, watchdog time.Duration) error {
	if wait < 0 {
		return fmt.Errorf("--wait must not be negative, got %v", wait)
	}
	if grace < 0 {
		return fmt.Errorf("--grace must not be negative, got %v", grace)
	}
	if ttlSet {
		if err := fence.ValidateTTL(ttl); err != nil {
			return fmt.Errorf("--ttl %v: %w", ttl, err)
		}
	}
	if err := fence.ValidateTTL(watchdog); err != nil {
		return fmt.Errorf("--watchdog-ttl %v: %w", watchdog, err)
	}
	return nil
}

// runHolding runs argv while lease is held and releases it afterwards. When
// the command exits, what is left of its process group (background jobs,
// and orphans that left the group, see adoptOrphans) is ended before the
// lock is released: SIGTERM, then SIGKILL after grace.
func runHolding(cmd *cobra.Command, lease fence.Lease, argv []string, grace time.Duration) error {
	stderr := cmd.ErrOrStderr()
	notes := newNotes(stderr)
	defer notes.close()
	release := func() error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(cmd.Context()), releaseTimeout)
		defer cancel()
		return releaseRetrying(ctx, lease)
	}
	child := exec.Command(argv[0], argv[1:]...)
	// fence's credentials stay with fence: FENCE_REDIS_URL and its kind
	// are not passed on (a fence inside the command needs its own).
	child.Env = append(childEnv(os.Environ()),
		"FENCE_TOKEN="+strconv.FormatInt(int64(lease.Token()), 10),
		"FENCE_LOCK="+lease.Name())
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, cmd.OutOrStdout(), stderr
	tty := foregroundTTY()
	child.SysProcAttr = procAttr(tty)
	adoptOrphans()

	sigs := make(chan os.Signal, 4)
	// SIGUSR1 and SIGUSR2 too: unhandled, they ended fence (Go's default),
	// the command killed by Pdeathsig and its background left running
	// (TestExecPassesUSR1); a reload sent to the service's main pid,
	// which is fence, is meant for the command.
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(sigs)
	// From here on a signal is passed to the command. One that came
	// before (after Acquire returned, or during an Acquire that succeeded
	// anyway) only ended Main's signal context: the caller asked fence
	// to stop before the command started, so it is not started
	// (TestExecSignalBeforeStartNotLost: it ran to the end before).
	if err := cmd.Context().Err(); err != nil {
		return exitWith(ExitInterrupted, errors.Join(
			fmt.Errorf("interrupted before the command started (%w); lock %q released", context.Cause(cmd.Context()), lease.Name()), release()))
	}
	// A lease that ended since Acquire returned (fence paused past the
	// lease time, the key deleted, a failover) does not start the command:
	// it may be irreversible, and SIGTERM after its start comes too late
	// for a short one (TestExecLeaseEndedBeforeStartNotStarted: it ran).
	if err := lease.Err(); err != nil {
		_ = release()
		return exitWith(ExitLeaseLost, fmt.Errorf("lease on %q lost before the command started; not started: %w", lease.Name(), err))
	}
	onTTY := controllingTTY() >= 0
	if onTTY {
		// While the command has the terminal, fence is a background
		// process: writing to it (with stty tostop) or taking it back
		// would stop fence with SIGTTOU. Ignored only after the fork, so
		// that the command does not inherit the ignoring.
		defer signal.Reset(syscall.SIGTTOU)
	}
	started := make(chan error, 1)
	exited := make(chan struct{})
	var shim *shimCommand
	go func() {
		// The command runs under the exec shim, fence re-executed, which
		// ends the command's group if fence dies (see exec_shim.go).
		// Locked until the shim has been waited for: its Pdeathsig fires
		// when the forking thread ends (see procAttr).
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var err error
		shim, err = startShim(child, grace)
		if err != nil {
			started <- err
			return
		}
		if onTTY {
			signal.Ignore(syscall.SIGTTOU)
		}
		// From the shim's start: a ^Z before the command has started
		// stops the shim, and fence follows.
		go followStops(shim.Process.Pid, shim.Process.Pid)
		if err := shim.waitStarted(); err != nil {
			_ = shim.Wait()
			shim.close()
			started <- err
			return
		}
		started <- nil
		_ = shim.Wait()
		close(exited)
	}()
	if err := <-started; err != nil {
		if tty >= 0 {
			// The child may have taken the terminal before its exec failed.
			signal.Ignore(syscall.SIGTTOU)
			takeTerminal(tty)
		}
		return exitWith(127, errors.Join(err, release()))
	}

	defer shim.close() // after the shim has exited (exited, below)
	pgid := shim.Process.Pid
	// Orphans fence adopted (adoptOrphans) are reaped as they exit, not
	// only when the command has: see reapAdopted.
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, syscall.SIGCHLD)
	defer signal.Stop(chld)
	reapAdopted(pgid)
	leaseDone := lease.Done()
	var kill <-chan time.Time
	var lost error
	for {
		select {
		case <-exited:
			endGroup(pgid, grace, notes)
			reclaimTerminal(pgid)
			relErr := release()
			if lost == nil && errors.Is(relErr, fence.ErrLeaseLost) {
				lost = relErr
			}
			if lost != nil {
				return exitWith(ExitLeaseLost, fmt.Errorf("lease on %q lost while the command ran: %w", lease.Name(), lost))
			}
			if relErr != nil {
				notes.printf("%s\n", errorLine(fmt.Errorf("release: %w", relErr), nil))
			}
			// The shim exits with the command's status as exitCode has it.
			if code := exitCode(shim.ProcessState); code != 0 {
				return exitWith(code, nil)
			}
			return nil
		case <-leaseDone:
			leaseDone = nil
			lost = lease.Err()
			signalAll(pgid, syscall.SIGTERM)
			kill = time.After(grace)
			notes.printf("%s\n", errorLine(fmt.Errorf("lease on %q lost (%w); sending SIGTERM to the command", lease.Name(), lost), nil))
		case <-kill:
			signalAll(pgid, syscall.SIGKILL)
			notes.printf("fence: the command is still running %v after SIGTERM; sending SIGKILL\n", grace)
		case s := <-sigs:
			_ = syscall.Kill(-pgid, s.(syscall.Signal))
		case <-chld:
			reapAdopted(pgid)
		}
	}
}

// notes writes exec's own lines while the command runs (a lost lease,
// SIGKILL, a failed release) to stderr from a goroutine of its own, so
// that a stderr that blocks (a pipe whose reader stopped reading: "2>&1 |
// less" at its first page, a stuck log shipper) never holds up a signal to
// the command or the release of the lock. Before, exec wrote "lease lost"
// before its SIGTERM and blocked there: the command ran on with a lost
// lease for as long as the reader stalled (TestExecLostLeaseStderrBlocked).
// A line that finds notesQueue lines waiting is dropped.
type notes struct {
	lines chan string
	done  chan struct{}
}

const notesQueue = 16

func newNotes(w io.Writer) *notes {
	n := &notes{lines: make(chan string, notesQueue), done: make(chan struct{})}
	go func() {
		defer close(n.done)
		for l := range n.lines {
			_, _ = io.WriteString(w, l)
		}
	}()
	return n
}

func (n *notes) printf(format string, args ...any) {
	select {
	case n.lines <- fmt.Sprintf(format, args...):
	default:
	}
}

// close waits until the lines are written, so that they come before
// exec's last line (Main's), as they were sent. By then the command's
// processes are ended and the lock released.
func (n *notes) close() {
	close(n.lines)
	<-n.done
}

// signalAll sends sig to the command's group and to fence's adopted
// orphans, with SIGCONT after it so that stopped processes act on it, and
// returns the processes it found.
func signalAll(pgid int, sig syscall.Signal) []int {
	_ = syscall.Kill(-pgid, sig)
	members := groupMembers(pgid)
	for _, pid := range members {
		_ = syscall.Kill(pid, sig)
	}
	if sig != syscall.SIGKILL {
		_ = syscall.Kill(-pgid, syscall.SIGCONT)
		for _, pid := range members {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	return members
}

// groupPoll is how often endGroup looks whether the command's processes
// are gone, and killWait how long it waits for them after SIGKILL.
const (
	groupPoll = 10 * time.Millisecond
	killWait  = 5 * time.Second
)

// endGroup ends what is left of the command's processes after the command
// itself has exited: SIGTERM, then SIGKILL after grace. It returns when
// none is left, or killWait after SIGKILL with a warning (a process in
// uninterruptible sleep outlives even SIGKILL for a while).
func endGroup(pgid int, grace time.Duration, notes *notes) {
	reapOrphans()
	if len(groupMembers(pgid)) == 0 {
		return
	}
	if waitGroup(pgid, syscall.SIGTERM, grace) {
		return
	}
	notes.printf("fence: processes the command left are still running %v after SIGTERM; sending SIGKILL\n", grace)
	if waitGroup(pgid, syscall.SIGKILL, killWait) {
		return
	}
	notes.printf("fence: processes the command left are still there %v after SIGKILL; releasing the lock anyway\n", killWait)
}

// waitGroup sends sig to the command's processes, and to any that join
// them meanwhile (orphans reparented to fence), and reports whether all are
// gone within limit.
func waitGroup(pgid int, sig syscall.Signal, limit time.Duration) bool {
	signaled := map[int]bool{}
	for _, pid := range signalAll(pgid, sig) {
		signaled[pid] = true
	}
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	tick := time.NewTicker(groupPoll)
	defer tick.Stop()
	for {
		select {
		case <-deadline.C:
			return false
		case <-tick.C:
		}
		reapOrphans()
		left := groupMembers(pgid)
		if len(left) == 0 {
			return true
		}
		for _, pid := range left {
			if !signaled[pid] {
				signaled[pid] = true
				_ = syscall.Kill(pid, sig)
				_ = syscall.Kill(pid, syscall.SIGCONT)
			}
		}
	}
}

// releaseRetrying releases lease, and retries a failure without a
// conclusion (a backend error, a link that broke under the request; not
// fence.ErrLeaseLost, nor fence.ErrClosed) until ctx ends, as fence.Run
// does: nobody else holds the lease to retry with, and the lock would stay
// held, by nobody, until its lease time ran out, every other exec of the
// name refused meanwhile (TestExecReleaseRetriedAfterBrokenLink: 60 s).
func releaseRetrying(ctx context.Context, lease fence.Lease) error {
	return pause.Retry(ctx, lease.Release(ctx), func() error { return lease.Release(ctx) }, func(err error) bool {
		return errors.Is(err, fence.ErrLeaseLost) || errors.Is(err, fence.ErrClosed)
	})
}

// exitCode is the child's exit status as a shell reports it.
func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
