package worker

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// QueueSpec makes a worker the queue example's consumer (scenario 13):
// queue.Consumer, the package examples/queue ships, campaigning with
// fence.Lead on a redislock lock of the Spec's Redis and applying each
// message in the PostgreSQL database DB. The worker's Write says how each
// message's transaction is fenced: WriteGuard is guard.Tx (what the example
// ships), WriteNaive a plain transaction without a fence (the control),
// WriteWeak the fence with its comparison weakened (a mutation). The unique
// constraint on the message id is the database's: the lab drops it for the
// control. The worker runs until its standard input closes.
type QueueSpec struct {
	DB     string        `json:"db"` // postgres://…
	Stream string        `json:"stream"`
	Group  string        `json:"group"`
	Lease  time.Duration `json:"lease"` // the lock's lease time (redislock's WatchdogTTL), and MinIdle
	// Stops lists where the worker stops itself with SIGSTOP until the
	// controller continues it: "<point>:<n>", point before-fence or
	// before-commit (queue.Point), at the n-th message the worker reaches
	// that point with, counting per point, once each.
	Stops []string `json:"stops,omitempty"`
}

// The history of a queue worker: events of kind KindQueue whose phase is
// the consumer's log message (queue.LogApplied, LogDuplicate, LogRejected,
// LogFailed, LogDead, LogElected, LogClaimed), with the message id as Op, and pause
// events (kind pause, Value the point) around each stop.
const KindQueue = "queue"

// queueMain runs a queue worker; see QueueSpec.
func queueMain(s Spec) int {
	q := s.Queue
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "lab worker:", err)
		return 2
	}
	// A cancelled context interrupts a blocked XREADGROUP (as queued).
	client := redis.NewClient(&redis.Options{Addr: s.Redis, ContextTimeoutEnabled: true, DialTimeout: time.Second})
	defer client.Close()
	db, err := sql.Open("pgx", q.DB)
	if err != nil {
		return fail(err)
	}
	defer db.Close()
	locker, err := redislock.New(client, &redislock.Options{WatchdogTTL: q.Lease})
	if err != nil {
		return fail(err)
	}
	w := &worker{s: s, out: os.Stdout}
	pause, err := w.queueStops(q.Stops)
	if err != nil {
		return fail(err)
	}
	c := &queue.Consumer{
		Redis: client, DB: db, Stream: q.Stream, Group: q.Group, Name: s.ID,
		MinIdle: q.Lease, Pause: pause, Log: slog.New(&eventHandler{w: w}),
	}
	switch s.Write {
	case WriteGuard:
	case WriteNaive:
		c.Tx = func(ctx context.Context, db *sql.DB, _ string, _ fence.Token, fn func(*sql.Tx) error) error {
			return inTx(ctx, db, fn)
		}
	case WriteWeak:
		c.Tx = func(ctx context.Context, db *sql.DB, resource string, token fence.Token, fn func(*sql.Tx) error) error {
			return inTx(ctx, db, func(tx *sql.Tx) error {
				if err := weakFence(ctx, tx, "GREATEST", resource, int64(token)); err != nil {
					return err
				}
				return fn(tx)
			})
		}
	default:
		return fail(fmt.Errorf("queue worker: write mode %q", s.Write))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); cancel() }()
	if err := c.Run(ctx, locker); err != nil && ctx.Err() == nil {
		return fail(err)
	}
	return 0
}

// queueStops returns the consumer's Pause hook for stops (QueueSpec.Stops).
func (w *worker) queueStops(stops []string) (func(queue.Point, queue.Message, fence.Token), error) {
	at := map[string]map[int]bool{}
	for _, s := range stops {
		point, nth, _ := strings.Cut(s, ":")
		n, err := strconv.Atoi(nth)
		if err != nil || n <= 0 || (point != queue.BeforeFence.String() && point != queue.BeforeCommit.String()) {
			return nil, fmt.Errorf("queue worker: stop %q: want before-fence:<n> or before-commit:<n>", s)
		}
		if at[point] == nil {
			at[point] = map[int]bool{}
		}
		at[point][n] = true
	}
	seen := map[string]int{}
	return func(p queue.Point, m queue.Message, token fence.Token) {
		point := p.String()
		seen[point]++
		if at[point][seen[point]] {
			w.pauseAt(m.Key, int64(token), point)
		}
	}, nil
}

// eventHandler is a slog.Handler that writes the consumer's log records as
// history events: kind KindQueue, phase the record's message, Op its
// message id (msg_id, the key queue_applied is keyed by; the entry id for
// a record without one), Token its token, Err its err.
type eventHandler struct{ w *worker }

func (h *eventHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *eventHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *eventHandler) WithGroup(string) slog.Handler            { return h }

func (h *eventHandler) Handle(_ context.Context, r slog.Record) error {
	e := Event{Kind: KindQueue, Phase: r.Message}
	var entry string
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "id":
			entry = a.Value.String()
		case "msg_id":
			e.Op = a.Value.String()
		case "token":
			e.Token = a.Value.Int64()
		case "err":
			e.Err = a.Value.String()
		case "n":
			e.Value = []string{a.Value.String()}
		}
		return true
	})
	if e.Op == "" {
		e.Op = entry
	}
	h.w.emit(e)
	return nil
}
