package lab

import (
	"database/sql"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/fencekit/fence/cmd/fence/lab/worker"
	"github.com/fencekit/fence/examples/queue"
	"github.com/redis/go-redis/v9"
)

// QueueScenario is the number of the single-consumer scenario, whose rows
// have no lease-by-lease timeline to zoom into.
const QueueScenario = 13

// The queue scenario's stream and consumer group.
const (
	queueStream = "jobs"
	queueGroup  = "appliers"
)

// queueVerdict is what scenario 13 measured, from the effect table and
// the consumers' logs.
type queueVerdict struct {
	messages, doubled, lost, rejected int
	examples                          []string
}

// singleConsumer is scenario 13, the article's single active consumer as
// examples/queue ships it: two consumer processes (A and B, the lab worker
// running queue.Consumer) under fence.Lead on one redis-server's lock,
// reading one stream through a consumer group, each message's effect
// applied in PostgreSQL in one transaction, fenced on the message with the
// leader's token (guard.Tx) and with a unique constraint on the message id.
// Three faults, in turn:
//
//  1. A, leading, stops itself (SIGSTOP) in the middle of a message, after
//     its lease check and before the fence, past its lease; B is elected,
//     claims A's pending entries (XAUTOCLAIM) and applies the message; A is
//     continued and commits late. The fence must reject it.
//  2. B stops itself inside a transaction (after the fence and the
//     effect, before the commit); A is elected, claims the message and
//     waits for B's transaction (the fence's row lock; the workers set no
//     idle_in_transaction_session_timeout), or applies it if nothing makes
//     it wait; B is continued and commits first. A must then find the
//     message applied: the unique constraint.
//  3. A stops inside a transaction again and is SIGKILLed there; B takes
//     over and finishes the stream.
//
// The control is the same consumer without the fence (a plain transaction)
// and without the unique constraint: both late commits are accepted and
// their messages applied twice. The checker counts, per message id, the
// rows of the effect table: P3 is the messages applied twice or never.
// Protected must show none, and late commits rejected by the fence.
func singleConsumer(x *experiment) error {
	x.fenceControl = true
	n := x.scale(200, 2000)
	lease := time.Duration(x.scale(1, 2)) * time.Second
	srv, err := x.redis()
	if err != nil {
		return err
	}
	dsn, err := x.pg.database(x.ctx)
	if err != nil {
		return err
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := queue.CreateSchema(x.ctx, db); err != nil {
		return err
	}
	if !x.protected || x.cfg.dropUnique {
		if _, err := db.ExecContext(x.ctx, `ALTER TABLE queue_applied DROP CONSTRAINT queue_applied_pkey`); err != nil {
			return fmt.Errorf("dropping the unique constraint: %w", err)
		}
	}
	rdb := srv.Client()
	defer rdb.Close()
	ids, want, err := produce(x, rdb, n)
	if err != nil {
		return err
	}

	q := n / 4
	spec := func(id string, stops ...string) Spec {
		return Spec{ID: id, Redis: srv.Addr, Queue: &worker.QueueSpec{DB: dsn, Stream: queueStream, Group: queueGroup, Lease: lease, Stops: stops}}
	}
	s := &queueSteps{x: x, db: db, rdb: rdb, lease: lease}
	s.run(spec("A", fmt.Sprintf("%s:%d", queue.BeforeFence, q), fmt.Sprintf("%s:%d", queue.BeforeCommit, 2*q)),
		spec("B", fmt.Sprintf("%s:%d", queue.BeforeCommit, q)), n)
	// Whatever happened, every worker goes on and ends.
	s.finishAll()
	x.queue = s.verdict(ids, want)
	return nil
}

// produce appends n messages to the stream (account acct-(i mod 10),
// amount i) as users do, through queue.Produce (odd i: a random message
// id) and queue.ProduceID (even i: the caller's id, lab-<i>), and returns
// the message ids the stream's entries carry (queue.IDField), read back
// with XRANGE, and the sum of the amounts. An entry without a message id
// is an error: the consumer would key it by its entry id, which is not
// what Produce ships.
func produce(x *experiment, rdb *redis.Client, n int) (map[string]bool, int64, error) {
	var want int64
	for i := 1; i <= n; i++ {
		account := fmt.Sprintf("acct-%d", i%10)
		var err error
		if i%2 == 1 {
			_, err = queue.Produce(x.ctx, rdb, queueStream, account, int64(i))
		} else {
			_, err = queue.ProduceID(x.ctx, rdb, queueStream, fmt.Sprintf("lab-%d", i), account, int64(i))
		}
		if err != nil {
			return nil, 0, fmt.Errorf("producing message %d: %w", i, err)
		}
		want += int64(i)
	}
	entries, err := rdb.XRange(x.ctx, queueStream, "-", "+").Result()
	if err != nil {
		return nil, 0, fmt.Errorf("reading the stream back: %w", err)
	}
	ids := map[string]bool{}
	for _, e := range entries {
		id, _ := e.Values[queue.IDField].(string)
		if id == "" || ids[id] {
			return nil, 0, fmt.Errorf("entry %s carries no message id, or one seen before: %q", e.ID, e.Values)
		}
		ids[id] = true
	}
	if len(ids) != n {
		return nil, 0, fmt.Errorf("produced %d messages, the stream holds %d", n, len(ids))
	}
	return ids, want, nil
}

// queueSteps drives the scenario's faults; the first step that does not
// happen notes the fault as one that did not bite (which fails the run)
// and ends the sequence.
type queueSteps struct {
	x      *experiment
	db     *sql.DB
	rdb    *redis.Client
	lease  time.Duration
	a, b   *workerProc
	killed *workerProc
	// faults are the messages of the late commits (faults 1 and 2) whose
	// steps happened: the control must apply each twice.
	faults []string
}

func (s *queueSteps) run(specA, specB Spec, n int) {
	x := s.x
	var err error
	if s.a, err = x.spawn(specA); err != nil {
		x.noteOnce(err.Error())
		return
	}
	if _, ok := s.event("A", "election of A", 20*time.Second, queue.LogElected, 0); !ok {
		return
	}
	if s.b, err = x.spawn(specB); err != nil {
		x.noteOnce(err.Error())
		return
	}

	// 1. A stops before the fence; B takes over and applies the message.
	stopA, ok := s.stop("A", 60*time.Second)
	if !ok {
		return
	}
	if _, ok := s.event("B", "B's election after A stopped", s.lease+10*time.Second, queue.LogElected, stopA.Token); !ok {
		return
	}
	if !s.until("B applying "+stopA.Op, 10*time.Second, func() (bool, error) {
		return s.appliedBy(stopA.Op, "B")
	}) {
		return
	}
	s.a.signal(syscall.SIGCONT)
	if !s.outcome("A", stopA.Op) {
		return
	}
	s.faults = append(s.faults, stopA.Op)

	// 2. B stops inside its transaction; A takes over, and B commits first.
	stopB, ok := s.stop("B", 60*time.Second)
	if !ok {
		return
	}
	if _, ok := s.event("A", "A's election after B stopped", s.lease+10*time.Second, queue.LogElected, stopB.Token); !ok {
		return
	}
	if !s.until("A waiting for B's transaction or applying "+stopB.Op, 10*time.Second, func() (bool, error) {
		if ok, err := s.appliedBy(stopB.Op, "A"); ok || err != nil {
			return ok, err
		}
		var waiting int
		err := s.db.QueryRowContext(x.ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		return waiting > 0, err
	}) {
		return
	}
	s.b.signal(syscall.SIGCONT)
	if !s.outcome("B", stopB.Op) || !s.outcome("A", stopB.Op) {
		return
	}
	s.faults = append(s.faults, stopB.Op)

	// 3. A stops inside a transaction and is killed there; B takes over.
	stopA2, ok := s.stop("A", 60*time.Second)
	if !ok {
		return
	}
	s.killed = s.a
	s.a.kill()
	if _, ok := s.event("B", "B's election after A was killed", s.lease+10*time.Second, queue.LogElected, stopA2.Token); !ok {
		return
	}
	s.until("every message applied and acknowledged", 2*time.Minute, func() (bool, error) {
		var applied int
		if err := s.db.QueryRowContext(x.ctx, `SELECT count(DISTINCT msg_id) FROM queue_applied`).Scan(&applied); err != nil {
			return false, err
		}
		p, err := s.rdb.XPending(x.ctx, queueStream, queueGroup).Result()
		return applied >= n && err == nil && p.Count == 0, err
	})
}

// stop waits for worker who to stop itself, and for the process to be in
// the stopped state.
func (s *queueSteps) stop(who string, limit time.Duration) (Event, bool) {
	e, ok := s.x.waitEvent(func(e Event) bool { return e.Worker == who && e.Kind == "pause" && e.Phase == "invoke" && !s.seen(e) }, limit)
	if !ok {
		s.x.noteOnce(fmt.Sprintf("fault did not bite: %s did not stop itself within %v", who, limit))
		return e, false
	}
	s.x.mu.Lock()
	s.x.queuePauses = append(s.x.queuePauses, e)
	s.x.mu.Unlock()
	w := s.x.worker(who)
	until := time.Now().Add(5 * time.Second)
	for !stopped(w) {
		if time.Now().After(until) {
			s.x.noteOnce(fmt.Sprintf("%s announced its stop but is not in the stopped state", who))
			return e, false
		}
		time.Sleep(time.Millisecond)
	}
	return e, true
}

// seen reports whether pause e was handled already.
func (s *queueSteps) seen(e Event) bool {
	s.x.mu.Lock()
	defer s.x.mu.Unlock()
	for _, p := range s.x.queuePauses {
		if p.Worker == e.Worker && p.Mono == e.Mono {
			return true
		}
	}
	return false
}

// event waits for a queue event of who with phase and a token above
// above.
func (s *queueSteps) event(who, what string, limit time.Duration, phase string, above int64) (Event, bool) {
	e, ok := s.x.waitEvent(func(e Event) bool {
		return e.Worker == who && e.Kind == worker.KindQueue && e.Phase == phase && e.Token > above
	}, limit)
	if !ok {
		s.x.noteOnce(fmt.Sprintf("fault did not bite: no %s within %v", what, limit))
	}
	return e, ok
}

// outcome waits until who's transaction of message id has ended: applied,
// duplicate, rejected or failed.
func (s *queueSteps) outcome(who, id string) bool {
	_, ok := s.x.waitEvent(func(e Event) bool {
		return e.Worker == who && e.Kind == worker.KindQueue && e.Op == id &&
			(e.Phase == queue.LogApplied || e.Phase == queue.LogDuplicate || e.Phase == queue.LogRejected || e.Phase == queue.LogFailed)
	}, 15*time.Second)
	if !ok {
		s.x.noteOnce(fmt.Sprintf("%s's transaction of %s did not end within 15s", who, id))
	}
	return ok
}

// until polls cond every 10 ms until it holds; after limit it notes what
// did not happen.
func (s *queueSteps) until(what string, limit time.Duration, cond func() (bool, error)) bool {
	deadline := time.Now().Add(limit)
	for {
		ok, err := cond()
		if err != nil {
			s.x.noteOnce(fmt.Sprintf("%s: %v", what, err))
			return false
		}
		if ok {
			return true
		}
		if time.Now().After(deadline) || s.x.ctx.Err() != nil {
			s.x.noteOnce(fmt.Sprintf("fault did not bite: no %s within %v", what, limit))
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// appliedBy reports whether consumer who applied message id.
func (s *queueSteps) appliedBy(id, who string) (bool, error) {
	var k int
	err := s.db.QueryRowContext(s.x.ctx, `SELECT count(*) FROM queue_applied WHERE msg_id = $1 AND consumer = $2`, id, who).Scan(&k)
	return k > 0, err
}

// finishAll continues every worker that may be stopped and tells them all
// to end.
func (s *queueSteps) finishAll() {
	for _, w := range []*workerProc{s.a, s.b} {
		if w != nil && w != s.killed {
			w.signal(syscall.SIGCONT)
			w.finish()
		}
	}
}

// verdict counts, per produced message, the rows of the effect table:
// doubled (more than one) and lost (none); and the late commits the fence
// rejected, from the consumers' logs.
func (s *queueSteps) verdict(ids map[string]bool, want int64) *queueVerdict {
	v := &queueVerdict{messages: len(ids)}
	ctx := s.x.ctx
	rows, err := s.db.QueryContext(ctx, `SELECT msg_id, count(*), string_agg(consumer || ' token ' || token, ', ' ORDER BY seq) FROM queue_applied GROUP BY msg_id`)
	if err != nil {
		s.x.noteOnce("reading the effect table: " + err.Error())
		return v
	}
	defer rows.Close()
	seen := map[string]bool{}
	counts := map[string]int{}
	for rows.Next() {
		var id, by string
		var k int
		if err := rows.Scan(&id, &k, &by); err != nil {
			s.x.noteOnce("reading the effect table: " + err.Error())
			return v
		}
		seen[id] = true
		counts[id] = k
		switch {
		case !ids[id]:
			v.doubled++
			v.example("message %s applied, which was never produced", id)
		case k > 1:
			v.doubled++
			v.example("message %s applied %d times (%s)", id, k, by)
		}
	}
	if err := rows.Err(); err != nil {
		s.x.noteOnce("reading the effect table: " + err.Error())
	}
	if !s.x.protected {
		if note := controlFaultsNote(counts, s.faults); note != "" {
			s.x.noteOnce(note)
		}
	}
	for id := range ids {
		if !seen[id] {
			v.lost++
			v.example("message %s never applied", id)
		}
	}
	var sum sql.NullInt64
	if err := s.db.QueryRowContext(ctx, `SELECT sum(balance) FROM queue_balance`).Scan(&sum); err == nil && sum.Int64 != want {
		v.example("the balances add up to %d, the messages to %d", sum.Int64, want)
	}
	for _, e := range s.x.hist.Events() {
		switch {
		case e.Kind == worker.KindQueue && e.Phase == queue.LogRejected:
			v.rejected++
			v.example("late commit of %s by %s, token %d, rejected by the fence", e.Op, e.Worker, e.Token)
		case e.Kind == worker.KindQueue && e.Phase == queue.LogDuplicate:
			v.example("%s, token %d, found %s applied (the unique constraint)", e.Worker, e.Token, e.Op)
		}
	}
	return v
}

// controlFaultsNote says which late commit of the control (the messages
// faults, by their fault's number) was not applied twice, counts being the
// rows per message: a control with one doubled message passes P3 > 0 while
// the other fault did not bite.
func controlFaultsNote(counts map[string]int, faults []string) string {
	for i, id := range faults {
		if counts[id] < 2 {
			return fmt.Sprintf("fault did not bite: the control applied %s (fault %d's late commit) %d times, not twice", id, i+1, counts[id])
		}
	}
	return ""
}

func (v *queueVerdict) example(format string, args ...any) {
	if len(v.examples) < 6 {
		v.examples = append(v.examples, fmt.Sprintf(format, args...))
	}
}

// fill writes the queue verdict into v: Ops the messages, P3 the messages
// applied twice or never, Rejected the late commits the fence rejected.
func (q *queueVerdict) fill(v *Verdict) {
	v.Messages, v.Doubled, v.Lost = q.messages, q.doubled, q.lost
	v.Ops, v.P3, v.Rejected = q.messages, q.doubled+q.lost, q.rejected
	v.Examples = append(v.Examples, q.examples...)
}

// stopped reports whether w's process is in the stopped state.
func stopped(w *workerProc) bool {
	if w == nil {
		return false
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", w.cmd.Process.Pid))
	if err != nil {
		return false
	}
	b := string(raw)
	f := strings.Fields(b[strings.LastIndexByte(b, ')')+1:])
	return len(f) > 0 && (f[0] == "T" || f[0] == "t")
}
