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
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence/examples/queue"
	"github.com/fencekit/fence/internal/redistest"
	_ "github.com/jackc/pgx/v5/stdlib"
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
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
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
	began := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "queued")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/fencekit/fence/examples/queue/cmd/queued").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	built := time.Now()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	name, err := pg.CreateDatabase(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", pg.DSN(name))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := queue.CreateSchema(ctx, db); err != nil {
		t.Fatal(err)
	}
	const stream, group = "jobs", "appliers"
	ids := map[string]bool{}
	var want int64
	for i := 1; i <= n; i++ {
		id, err := queue.Produce(ctx, rdb, stream, fmt.Sprintf("acct-%d", i%10), int64(i))
		if err != nil {
			t.Fatal(err)
		}
		ids[id] = true
		want += int64(i)
	}
	args := []string{"-redis", "redis://" + srv.Addr, "-db", pg.DSN(name), "-stream", stream, "-group", group, "-lease", lease.String()}
	ev := &events{changed: make(chan struct{})}
	is := func(msg, who string) func(event) bool {
		return func(e event) bool { return e.Msg == msg && e.who == who }
	}

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
		by, err := count(ctx, db, `SELECT max(token) FROM queue_applied WHERE stream = $1 AND msg_id = $2`, stream, stopA.ID)
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

	// Everything is applied and acknowledged.
	var state string
	until(t, 30*time.Second, "all messages applied and acknowledged", func() (bool, error) {
		rows, err := count(ctx, db, `SELECT count(*) FROM queue_applied`)
		if err != nil {
			return false, err
		}
		p, err := pending(ctx, rdb, stream, group)
		state = fmt.Sprintf("%d of %d applied, %d pending", rows, n, p)
		return rows >= n && p == 0, err
	}, &state)
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		t.Fatal("a did not exit on SIGTERM")
	}
	if !a.cmd.ProcessState.Success() {
		t.Fatalf("a: %v\n%s", a.cmd.ProcessState, a.stderr.String())
	}

	// Exactly once: every produced id applied, nothing else, the balances
	// add up (a second application would add twice), one "applied" line
	// per message.
	rows, err := db.QueryContext(ctx, `SELECT msg_id FROM queue_applied WHERE stream = $1`, stream)
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		if !ids[id] {
			t.Errorf("applied %s, which was not produced", id)
		}
		got++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	sum, err := count(ctx, db, `SELECT sum(balance) FROM queue_balance`)
	if err != nil {
		t.Fatal(err)
	}
	applied := ev.count(func(e event) bool { return e.Msg == queue.LogApplied })
	rejected := ev.count(func(e event) bool { return e.Msg == queue.LogRejected })
	claimed := ev.count(func(e event) bool { return e.Msg == queue.LogClaimed })
	if got != n || sum != want || applied != n {
		t.Fatalf("%d rows, balance %d, %d applied lines; want %d, %d, %d", got, sum, applied, n, want, n)
	}
	if rejected == 0 || claimed == 0 {
		t.Fatalf("%d late writes rejected, %d claims: the faults did not bite", rejected, claimed)
	}
	var killedBy string
	if err := db.QueryRowContext(ctx, `SELECT consumer FROM queue_applied WHERE stream = $1 AND msg_id = $2`, stream, stopB.ID).Scan(&killedBy); err != nil || killedBy != "a" {
		t.Fatalf("the message b died on: applied by %q, %v; want a", killedBy, err)
	}
	t.Logf("%d messages applied once each; %d late writes rejected, %d claims, %d duplicates; %v (build %v)",
		n, rejected, claimed, ev.count(func(e event) bool { return e.Msg == queue.LogDuplicate }),
		time.Since(built).Round(time.Millisecond), built.Sub(began).Round(time.Millisecond))
}
