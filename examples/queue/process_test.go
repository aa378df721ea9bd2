package queue_test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence/examples/queue"
	"github.com/fencekit/fence/internal/child"
	"github.com/fencekit/fence/internal/redistest"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"
)

// event is one JSON log line of a queued process.
type event struct {
	Msg      string `json:"msg"`
	Consumer string `json:"consumer"`
	ID       string `json:"id"`
	Token    int64  `json:"token"`
	Point    string `json:"point"`
	who      string
	at       time.Time
}

// events collects the log lines of the queued processes.
type events struct {
	mu      sync.Mutex
	all     []event
	changed chan struct{} // closed and replaced at each new event
}

func (e *events) add(ev event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = append(e.all, ev)
	close(e.changed)
	e.changed = make(chan struct{})
}

// wait returns the first event that matches, waiting for it until within
// has passed.
func (e *events) wait(t *testing.T, within time.Duration, what string, match func(event) bool) event {
	t.Helper()
	timeout := time.NewTimer(within)
	defer timeout.Stop()
	for {
		e.mu.Lock()
		for _, ev := range e.all {
			if match(ev) {
				e.mu.Unlock()
				return ev
			}
		}
		changed := e.changed
		e.mu.Unlock()
		select {
		case <-changed:
		case <-timeout.C:
			t.Fatalf("no %s within %v", what, within)
		}
	}
}

func (e *events) count(match func(event) bool) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, ev := range e.all {
		if match(ev) {
			n++
		}
	}
	return n
}

type proc struct {
	cmd    *exec.Cmd
	done   chan struct{}
	stderr strings.Builder // lines that are not JSON
}

// start runs queued as consumer who, with its JSON log lines going to ev.
func start(t *testing.T, bin string, ev *events, who string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"-json", "-name", who}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	child.DieWithParent(cmd)
	out, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var e event
			if json.Unmarshal(sc.Bytes(), &e) != nil {
				p.stderr.WriteString(sc.Text() + "\n")
				continue
			}
			e.who, e.at = who, time.Now()
			ev.add(e)
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	return p
}

// waitStopped waits until the process is in the stopped state.
func waitStopped(t *testing.T, p *proc) {
	t.Helper()
	until(t, 5*time.Second, "stopped state", func() (bool, error) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
		if err != nil {
			return false, err
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		return len(f) > 0 && (f[0] == "T" || f[0] == "t"), nil
	})
}

// The article's single consumer, on real processes: two queued consumers
// under fence.Lead on one redis-server, effects in PostgreSQL, 2,000
// messages. The leader (a) stops itself with SIGSTOP in the middle of a
// message, after checking its lease and before the fenced transaction; b
// takes over once a's lease has run out, claims a's pending entries with
// XAUTOCLAIM and applies the one a stopped on; a is continued and its late
// transaction is rejected by the fence. Later b stops inside a transaction
// (after the fence and the effect, before the commit) and is SIGKILLed; a
// leads again, claims b's entries and finishes. Every message's effect is
// applied exactly once, none is lost or left pending, and the late write was
// rejected.
func TestSingleConsumerPausedThenKilled(t *testing.T) {
	const (
		n     = 2000
		lease = 2 * time.Second
	)
	x := setup(t, n, lease)
	ctx, db, bin, args, ev, is := x.ctx, x.db, x.bin, x.args, x.ev, x.is
	const stream = "jobs"

	// a leads first: b starts once a is elected.
	a := start(t, bin, ev, "a", []string{"QUEUED_TEST_STOP=before-fence:300"}, args...)
	ev.wait(t, 10*time.Second, "election of a", is(queue.LogElected, "a"))
	b := start(t, bin, ev, "b", []string{"QUEUED_TEST_STOP=before-commit:700"}, args...)

	// a stops in the middle of its 300th message.
	stopA := ev.wait(t, 20*time.Second, "stop of a", is("stop", "a"))
	waitStopped(t, a)
	t.Logf("a stopped before the fence of %s, token %d", stopA.ID, stopA.Token)

	// b leads after a's lease ran out, and applies the message a stopped on.
	elB := ev.wait(t, lease+5*time.Second, "election of b", is(queue.LogElected, "b"))
	t.Logf("b elected %v after a stopped (lease %v), token %d", elB.at.Sub(stopA.at).Round(time.Millisecond), lease, elB.Token)
	if elB.Token <= stopA.Token {
		t.Fatalf("b's token %d is not greater than a's %d", elB.Token, stopA.Token)
	}
	until(t, lease+10*time.Second, "b applying "+stopA.ID, func() (bool, error) {
		by, err := count(ctx, db, `SELECT max(token) FROM queue_applied WHERE stream = $1 AND entry_id = $2`, stream, stopA.ID)
		return by > stopA.Token, err
	})
	stoppedFor := time.Since(stopA.at)
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	rej := ev.wait(t, 10*time.Second, "rejection of a's late write", is(queue.LogRejected, "a"))
	if rej.ID != stopA.ID || rej.Token != stopA.Token {
		t.Fatalf("a's rejection: %+v, want message %s token %d", rej, stopA.ID, stopA.Token)
	}
	t.Logf("a continued after %v stopped; its late write of %s rejected", stoppedFor.Round(time.Millisecond), rej.ID)

	// b stops inside a transaction, and is killed there.
	stopB := ev.wait(t, 20*time.Second, "stop of b", is("stop", "b"))
	waitStopped(t, b)
	if err := b.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-b.done
	killed := time.Now()
	t.Logf("b killed before the commit of %s, token %d", stopB.ID, stopB.Token)
	elA := ev.wait(t, lease+5*time.Second, "election of a after b's death", func(e event) bool {
		return e.Msg == queue.LogElected && e.who == "a" && e.Token > stopB.Token
	})
	t.Logf("a elected %v after b was killed", elA.at.Sub(killed).Round(time.Millisecond))

	x.finish(t, n, a)
	rejected := ev.count(func(e event) bool { return e.Msg == queue.LogRejected })
	claimed := ev.count(func(e event) bool { return e.Msg == queue.LogClaimed })
	if rejected == 0 || claimed == 0 {
		t.Fatalf("%d late writes rejected, %d claims: the faults did not bite", rejected, claimed)
	}
	var killedBy string
	if err := db.QueryRowContext(ctx, `SELECT consumer FROM queue_applied WHERE stream = $1 AND entry_id = $2`, stream, stopB.ID).Scan(&killedBy); err != nil || killedBy != "a" {
		t.Fatalf("the message b died on: applied by %q, %v; want a", killedBy, err)
	}
	t.Logf("%d messages applied once each; %d late writes rejected, %d claims, %d duplicates; %v (build %v)",
		n, rejected, claimed, ev.count(func(e event) bool { return e.Msg == queue.LogDuplicate }),
		time.Since(x.built).Round(time.Millisecond), x.built.Sub(x.began).Round(time.Millisecond))
}

// run is what the process tests share: the queued binary, redis-server,
// a database with the schema, n messages produced on stream "jobs".
type run struct {
	ctx          context.Context
	began, built time.Time
	bin          string
	args         []string // -redis, -db, -stream, -group, -lease
	db           *sql.DB
	rdb          *redis.Client
	ids          map[string]bool // the produced messages' stream entry ids
	want         int64           // the sum of their amounts
	ev           *events
	is           func(msg, who string) func(event) bool
}

func setup(t *testing.T, n int, lease time.Duration) *run {
	x := &run{began: time.Now(), ids: map[string]bool{}, ev: &events{changed: make(chan struct{})}}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	x.ctx = ctx
	x.bin = filepath.Join(t.TempDir(), "queued")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", x.bin, "github.com/fencekit/fence/examples/queue/cmd/queued").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	x.built = time.Now()
	srv := redistest.Start(t)
	x.rdb = srv.Client(t)
	name, err := pg.CreateDatabase(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	x.db, err = sql.Open("pgx", pg.DSN(name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.db.Close() })
	if err := queue.CreateSchema(ctx, x.db); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= n; i++ {
		id, err := queue.Produce(ctx, x.rdb, "jobs", fmt.Sprintf("acct-%d", i%10), int64(i))
		if err != nil {
			t.Fatal(err)
		}
		x.ids[id] = true
		x.want += int64(i)
	}
	x.args = []string{"-redis", "redis://" + srv.Addr, "-db", pg.DSN(name), "-stream", "jobs", "-group", "appliers", "-lease", lease.String()}
	x.is = func(msg, who string) func(event) bool {
		return func(e event) bool { return e.Msg == msg && e.who == who }
	}
	return x
}

// finish waits until all n messages are applied and none is pending, stops
// the live consumers with SIGTERM, and checks that each message was applied
// exactly once: every produced id and nothing else, the balances add up (a
// second application would add twice), one "applied" line per message; and
// in the stream's order.
func (x *run) finish(t *testing.T, n int, live ...*proc) {
	t.Helper()
	var state string
	until(t, 30*time.Second, "all messages applied and acknowledged", func() (bool, error) {
		rows, err := count(x.ctx, x.db, `SELECT count(*) FROM queue_applied`)
		if err != nil {
			return false, err
		}
		p, err := pending(x.ctx, x.rdb, "jobs", "appliers")
		state = fmt.Sprintf("%d of %d applied, %d pending", rows, n, p)
		return rows >= int64(n) && p == 0, err
	}, &state)
	for _, p := range live {
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			t.Fatal("a consumer did not exit on SIGTERM")
		}
		if !p.cmd.ProcessState.Success() {
			t.Fatalf("consumer: %v\n%s", p.cmd.ProcessState, p.stderr.String())
		}
	}
	rows, err := x.db.QueryContext(x.ctx, `SELECT entry_id FROM queue_applied WHERE stream = 'jobs' ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got, disorder := 0, 0
	var last string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		if !x.ids[id] {
			t.Errorf("applied %s, which was not produced", id)
		}
		if got > 0 && !before(last, id) {
			if disorder++; disorder <= 5 {
				t.Errorf("%s applied after %s", id, last)
			}
		}
		got++
		last = id
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	sum, err := count(x.ctx, x.db, `SELECT sum(balance) FROM queue_balance`)
	if err != nil {
		t.Fatal(err)
	}
	applied := x.ev.count(func(e event) bool { return e.Msg == queue.LogApplied })
	if disorder > 0 {
		t.Errorf("%d messages applied out of the stream's order", disorder)
	}
	if got != n || sum != x.want || applied != n {
		t.Fatalf("%d rows, balance %d, %d applied lines; want %d, %d, %d", got, sum, applied, n, x.want, n)
	}
}

// A consumer paused inside its transaction, after the fence, holds the
// message's fence row: the new leader that claims the message waits for it.
// queued's sessions have idle_in_transaction_session_timeout (the lease
// time), so PostgreSQL ends the paused transaction, the new leader applies
// the message, and the paused consumer's commit fails when it is continued.
func TestConsumerPausedInsideTransaction(t *testing.T) {
	const (
		n     = 100
		lease = 2 * time.Second
	)
	x := setup(t, n, lease)
	a := start(t, x.bin, x.ev, "a", []string{"QUEUED_TEST_STOP=before-commit:10"}, x.args...)
	x.ev.wait(t, 10*time.Second, "election of a", x.is(queue.LogElected, "a"))
	b := start(t, x.bin, x.ev, "b", nil, x.args...)
	stopA := x.ev.wait(t, 20*time.Second, "stop of a", x.is("stop", "a"))
	waitStopped(t, a)
	x.ev.wait(t, lease+5*time.Second, "election of b", x.is(queue.LogElected, "b"))
	until(t, 3*lease+10*time.Second, "b applying "+stopA.ID, func() (bool, error) {
		by, err := count(x.ctx, x.db, `SELECT max(token) FROM queue_applied WHERE stream = 'jobs' AND entry_id = $1`, stopA.ID)
		return by > stopA.Token, err
	})
	t.Logf("b applied %s %v after a stopped inside its transaction", stopA.ID, time.Since(stopA.at).Round(time.Millisecond))
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	failed := x.ev.wait(t, 10*time.Second, "failure of a's commit", x.is(queue.LogFailed, "a"))
	if failed.ID != stopA.ID {
		t.Fatalf("a failed on %s, want %s", failed.ID, stopA.ID)
	}
	x.finish(t, n, a, b)
}

// before reports whether stream id a comes before b.
func before(a, b string) bool {
	parse := func(id string) (ms, seq uint64) {
		x, y, _ := strings.Cut(id, "-")
		ms, _ = strconv.ParseUint(x, 10, 64)
		seq, _ = strconv.ParseUint(y, 10, 64)
		return ms, seq
	}
	am, as := parse(a)
	bm, bs := parse(b)
	return am < bm || (am == bm && as < bs)
}
