// Package worker is a worker process of fence's fault lab: it takes leases
// and reads and writes the lab's resource as its Spec says, and writes its
// history to standard output as JSON lines. The lab/cmd/labworker command
// runs Main; the lab builds that command and starts one process per
// worker, so that a signal pauses exactly one client. The package is kept
// small (fence, redislock, redlock, go-redis) so that the command builds quickly.
package worker

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/internal/child"
	"github.com/fencekit/fence/redislock"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sys/unix"
)

// Env names the environment variable that carries a worker's Spec.
const Env = "FENCE_LAB_WORKER"

// Spec tells a worker process what to do.
type Spec struct {
	ID    string `json:"id"`
	Redis string `json:"redis"` // host:port
	// Sentinels, if set, are the addresses of Redis Sentinels: the worker
	// reaches the primary they name for Master through them
	// (redis.NewFailoverClient), as a client of a Sentinel deployment does,
	// and Redis is ignored.
	Sentinels []string `json:"sentinels,omitempty"`
	Master    string   `json:"master,omitempty"`
	// Redlock, if set, are the addresses (host:port) of independent Redis
	// masters: the worker's lock is fence's redlock.New over one go-redis
	// client each, with redlock's defaults. The naive lock (Naive) still
	// uses Redis alone.
	Redlock []string `json:"redlock,omitempty"`
	Lock    string   `json:"lock"` // lock name
	// DB is the path of the lab's SQLite database, or the connection
	// string of its PostgreSQL database (postgres://…): the worker does its
	// read-modify-write there itself, as Write says. Without DB it asks
	// the HTTP resource at Resource to do it (guard's Middleware, or the
	// control's plain handler).
	DB       string `json:"db,omitempty"`
	Write    string `json:"write,omitempty"`    // WriteGuard, WriteNaive, WriteTokenOnly or WriteWeak
	Resource string `json:"resource,omitempty"` // host:port of the HTTP resource (or a proxy to it)
	Key      string `json:"key"`                // the resource register
	Naive    bool   `json:"naive"`              // the naive lock: SET NX PX and an INCR counter
	// The fence lock's replica sync: all zero is fence's defaults
	// (redislock.New(client, nil)).
	NoSync   bool          `json:"no_sync,omitempty"`  // turn the check off
	Replicas int           `json:"replicas,omitempty"` // expected replicas; 0 discovers
	Acks     int           `json:"acks,omitempty"`     // 0 (one), a number, or redislock.AcksAll
	TTL      time.Duration `json:"ttl"`
	Wait     time.Duration `json:"wait"`
	Ops      int           `json:"ops"`   // leases to take; 0: until standard input closes
	Think    time.Duration `json:"think"` // time between leases
	Work     time.Duration `json:"work"`  // time between the read and the write
	// PauseAt lists the ops (1-based) at which the worker stops itself with
	// SIGSTOP, at PausePoint, until the controller sends SIGCONT.
	PauseAt    []int  `json:"pause_at,omitempty"`
	PausePoint string `json:"pause_point,omitempty"` // "acquired", "read" or PauseReplies
	// ZooKeeper, if set, lists ZooKeeper servers (comma-separated): the
	// fence lock is then zklock's, with session timeout SessionTimeout,
	// instead of Redis's.
	ZooKeeper      string        `json:"zookeeper,omitempty"`
	SessionTimeout time.Duration `json:"session_timeout,omitempty"`
	// Etcd, if set, is a comma-separated list of etcd client URLs: the
	// worker takes its leases from etcd (etcdlock) instead of Redis.
	Etcd string `json:"etcd,omitempty"`
	// Queue, if set, makes the worker the queue example's consumer on the
	// stream at Redis (scenario 13); see QueueSpec. Write says how it
	// fences; the fields above but ID and Redis are ignored.
	Queue *QueueSpec `json:"queue,omitempty"`
}

// PauseReplies is the pause point inside Acquire, between sending the
// requests and reading the replies (see replyPause).
const PauseReplies = "replies"

// Main runs a worker from the Spec in Env, writing its history as JSON
// lines to stdout, until it has taken Spec.Ops leases or, if that is zero,
// until its standard input closes. It returns the process's exit code.
func Main() int {
	var s Spec
	if err := json.Unmarshal([]byte(os.Getenv(Env)), &s); err != nil {
		fmt.Fprintln(os.Stderr, "lab worker:", err)
		return 2
	}
	if s.Queue != nil {
		return queueMain(s)
	}
	w := &worker{s: s, out: os.Stdout, http: &http.Client{Timeout: 5 * time.Second}}
	var client *redis.Client
	if len(s.Sentinels) > 0 {
		client = redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.Master, SentinelAddrs: s.Sentinels,
			MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 3 * time.Second})
	} else {
		client = redis.NewClient(&redis.Options{Addr: s.Redis, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 3 * time.Second})
	}
	defer client.Close()
	switch {
	case s.Naive:
		w.locker = &naiveLocker{c: client}
		if s.PausePoint == PauseReplies {
			w.replies = &replyPause{w: w, nodes: 1, answered: map[string]int{}}
			client.AddHook(w.replies)
		}
	case len(s.Redlock) > 0:
		var clients []redis.UniversalClient
		if s.PausePoint == PauseReplies {
			w.replies = &replyPause{w: w, nodes: len(s.Redlock), answered: map[string]int{}}
		}
		for _, addr := range s.Redlock {
			c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 3 * time.Second})
			defer c.Close()
			if w.replies != nil {
				c.AddHook(w.replies)
			}
			clients = append(clients, c)
		}
		l, err := redlock.New(clients, nil) // redlock's defaults
		if err != nil {
			fmt.Fprintln(os.Stderr, "lab worker:", err)
			return 2
		}
		// Before the clients close (deferred earlier, run later): the
		// deletes Release left in flight past the majority finish.
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			_ = l.Close(ctx)
		}()
		w.locker = l
	case s.ZooKeeper != "":
		l, closeZK, err := zookeeperLocker(s)
		if err != nil {
			fmt.Fprintln(os.Stderr, "lab worker:", err)
			return 2
		}
		defer closeZK()
		w.locker = l
	case s.Etcd != "":
		l, closeEtcd, err := etcdLocker(s)
		if err != nil {
			fmt.Fprintln(os.Stderr, "lab worker:", err)
			return 2
		}
		defer closeEtcd()
		w.locker = l
	default:
		var opts *redislock.Options // fence's defaults
		if s.NoSync || s.Replicas != 0 || s.Acks != 0 {
			opts = &redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: s.NoSync, Replicas: s.Replicas, Acks: s.Acks}}
		}
		l, err := redislock.New(client, opts)
		if err != nil {
			fmt.Fprintln(os.Stderr, "lab worker:", err)
			return 2
		}
		w.locker = l
	}
	if s.DB != "" {
		db, err := OpenDB(s.DB)
		if err != nil {
			fmt.Fprintln(os.Stderr, "lab worker:", err)
			return 2
		}
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = EnsureRow(ctx, db, s.Key)
		cancel()
		if err != nil {
			fmt.Fprintln(os.Stderr, "lab worker:", err)
			return 2
		}
		w.db = db
	}
	stop := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(stop) }()
	think := time.NewTimer(0)
	for i := 1; s.Ops == 0 || i <= s.Ops; i++ {
		select {
		case <-stop:
			return 0
		case <-think.C:
		}
		w.op(i)
		think.Reset(s.Think)
	}
	return 0
}

type worker struct {
	s      Spec
	out    io.Writer
	http   *http.Client
	locker fence.Locker
	db     *sql.DB
	// replies, if set, pauses the worker inside Acquire (PauseReplies).
	replies *replyPause
}

// emit writes e, stamped now unless it carries a time already.
func (w *worker) emit(e Event) {
	e.Worker, e.Key = w.s.ID, w.s.Key
	if e.Mono == 0 {
		e.Mono = Mono()
	}
	_, _ = w.out.Write(e.line())
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// op is one lease: acquire, read the register, append the op id, write it
// back, release.
func (w *worker) op(i int) {
	id := fmt.Sprintf("%s-%d", w.s.ID, i)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pause := slices.Contains(w.s.PauseAt, i)
	if pause && w.replies != nil {
		w.replies.arm(id)
	}
	w.emit(Event{Op: id, Kind: "acquire", Phase: "invoke"})
	lease, err := w.locker.Acquire(ctx, w.s.Lock, fence.Wait(w.s.Wait), fence.TTL(w.s.TTL))
	if pause && w.replies != nil {
		w.replies.arm("") // the pause belongs to this acquisition only
	}
	if err != nil {
		w.emit(Event{Op: id, Kind: "acquire", Phase: "fail", Err: errString(err)})
		return
	}
	token := int64(lease.Token())
	w.emit(Event{Op: id, Kind: "acquire", Phase: "ok", Token: token})
	if pause && w.s.PausePoint == "acquired" {
		w.pause(id, token)
	}
	if w.db != nil {
		w.rmw(id, token, pause && w.s.PausePoint == "read")
	} else {
		w.rmwHTTP(id, token)
	}
	w.emit(Event{Op: id, Kind: "release", Phase: "invoke", Token: token})
	err = lease.Release(ctx)
	phase := "ok"
	if err != nil {
		phase = "fail"
	}
	w.emit(Event{Op: id, Kind: "release", Phase: phase, Token: token, Err: errString(err)})
}

// pause stops the process until the controller continues it: a GC pause or
// a stalled VM, as far as everyone else can tell (child.StopSelf: on Linux
// the signal goes to this very thread, so that it sends nothing more).
func (w *worker) pause(id string, token int64) { w.pauseAt(id, token, "") }

// pauseAt is pause with the point named in the events' Value.
func (w *worker) pauseAt(id string, token int64, point string) {
	var value []string
	if point != "" {
		value = []string{point}
	}
	w.emit(Event{Op: id, Kind: "pause", Phase: "invoke", Token: token, Value: value})
	_ = child.StopSelf()
	w.emit(Event{Op: id, Kind: "pause", Phase: "ok", Token: token, Value: value})
}

// rmw is the read-modify-write on the database, in the Spec's Write mode:
// read the ledger, append the op's id, write it back. The read and write
// events are emitted as they happen; the write's outcome is ok (committed),
// fail (rejected, or rolled back for a conflict) or unknown.
func (w *worker) rmw(id string, token int64, pauseAtRead bool) {
	// The database work is bounded, as the payment example bounds it by
	// its lease: a worker that waits for the row lock behind a paused
	// holder gives up after a while and takes a new lease, instead of
	// waiting out SQLite's busy timeout (its busy handler polls, and a
	// holder that takes the lock every few ms can keep it from a waiter
	// for the whole 10 s). The bound is well above a pause's length, so
	// that a paused holder's transaction is still open when it continues.
	ctx, cancel := context.WithTimeout(context.Background(), max(2*time.Second, 5*w.s.TTL))
	defer cancel()
	w.emit(Event{Op: id, Kind: "read", Phase: "invoke", Token: token})
	var next []string
	read := false
	_, _, err := Apply(ctx, w.db, w.s.Write, Op{ID: id, Worker: w.s.ID, Key: w.s.Key, Token: token}, func(value []string) {
		read = true
		w.emit(Event{Op: id, Kind: "read", Phase: "ok", Token: token, Value: value})
		if w.s.Work > 0 {
			time.Sleep(w.s.Work)
		}
		if pauseAtRead {
			// After the work: the pause hits just before the write.
			w.pause(id, token)
		}
		next = append(append([]string(nil), value...), id)
		w.emit(Event{Op: id, Kind: "write", Phase: "invoke", Token: token, Value: next})
	})
	phase := "ok"
	switch {
	case err == nil:
	case errors.Is(err, guard.ErrStale), errors.Is(err, guard.ErrRetry):
		phase = "fail"
	default:
		phase = "unknown"
	}
	if !read {
		// Rejected by the fence before it read: nothing was read or written.
		w.emit(Event{Op: id, Kind: "read", Phase: "fail", Token: token, Err: errString(err)})
		w.emit(Event{Op: id, Kind: "write", Phase: "invoke", Token: token})
	}
	w.emit(Event{Op: id, Kind: "write", Phase: phase, Token: token, Value: next, Err: errString(err)})
}

// rmwHTTP asks the HTTP resource to do the read-modify-write: one request,
// POST /payments/<key> with the token in guard's Fence-Token header. The
// read and the write both happen between sending it and the answer.
func (w *worker) rmwHTTP(id string, token int64) {
	t0 := Mono()
	body, _ := json.Marshal(Request{Op: id, Worker: w.s.ID})
	req, _ := http.NewRequest(http.MethodPost, "http://"+w.s.Resource+"/payments/"+w.s.Key, bytes.NewReader(body))
	req.Header.Set(guard.TokenHeader, strconv.FormatInt(token, 10))
	resp, err := w.http.Do(req)
	var out Response
	phase := "unknown"
	switch {
	case err != nil && errors.Is(err, syscall.ECONNREFUSED):
		phase = "fail"
	case err != nil:
	default:
		err = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusOK && err == nil:
			phase = "ok"
		case resp.StatusCode == http.StatusConflict:
			phase, err = "fail", errors.New("rejected: stale token")
		case err == nil:
			err = fmt.Errorf("resource answered %s", resp.Status)
		}
	}
	w.emit(Event{Op: id, Kind: "read", Phase: "invoke", Token: token, Mono: t0})
	if phase == "ok" {
		w.emit(Event{Op: id, Kind: "read", Phase: "ok", Token: token, Value: out.Read})
	} else {
		w.emit(Event{Op: id, Kind: "read", Phase: "fail", Token: token})
	}
	w.emit(Event{Op: id, Kind: "write", Phase: "invoke", Token: token, Value: out.Written, Mono: t0})
	w.emit(Event{Op: id, Kind: "write", Phase: phase, Token: token, Value: out.Written, Err: errString(err)})
}

// Request is the body of the HTTP resource's POST /payments/<key>.
type Request struct {
	Op     string `json:"op"`
	Worker string `json:"worker"`
}

// Response is the HTTP resource's answer to an accepted Request.
type Response struct {
	Read    []string `json:"read"`
	Written []string `json:"written"`
}

// Mono reads CLOCK_MONOTONIC in nanoseconds. All processes on the machine
// share it, so the events of the workers and of the controller order.
func Mono() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// Event is one line of a worker's history.
type Event struct {
	Worker string   `json:"worker"`
	Op     string   `json:"op,omitempty"`    // unique id of the operation
	Kind   string   `json:"kind"`            // acquire, read, write, release, pause
	Phase  string   `json:"phase"`           // invoke, ok, fail, unknown
	Token  int64    `json:"token,omitempty"` // the lease's token
	Key    string   `json:"key,omitempty"`   // the resource register
	Value  []string `json:"value,omitempty"`
	Err    string   `json:"err,omitempty"`
	Mono   int64    `json:"mono"`
}

func (e Event) line() []byte {
	b, _ := json.Marshal(e)
	return append(b, '\n')
}
