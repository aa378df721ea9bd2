package lab

import (
	"fmt"
	"sort"
	"strings"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redlock"
)

// Verdict is what the checker found in one run.
type Verdict struct {
	Ops int `json:"ops"` // writes attempted
	// P1 no stale accept: accepted reads and writes whose token was below
	// the largest the resource had accepted for that register.
	P1 int `json:"p1_stale_accepts"`
	// P2 token order: acquisitions that completed after another had
	// completed (strictly before they began) with a token not greater than
	// its, or that shared a token with another lease.
	P2 int `json:"p2_token_order"`
	// P3 nothing lost, nothing doubled: acknowledged writes missing from
	// (or doubled in) the final state, and failed writes present in it.
	P3 int `json:"p3_lost_or_doubled"`
	// P4 lease overlap: pairs of leases that believed they held the lock at
	// the same time. A figure, not a pass criterion.
	P4 int `json:"p4_overlaps"`
	// Registers is how many registers (rounds, in the failover scenarios)
	// the run used; TwoHolders on how many of them two leases overlapped.
	Registers  int `json:"registers"`
	TwoHolders int `json:"registers_with_two_holders"`
	// P5 linearizability of the client-side histories (see
	// checkLinearizable): Ok, Illegal or Unknown, naming the model that
	// failed; P5Histories are the histories checked.
	P5          string      `json:"p5_linearizable"`
	P5Histories []P5History `json:"p5_histories,omitempty"`

	// Who stopped the stale holder: acquisitions the lock refused (for
	// lack of replica acknowledgements, fence.ErrNotReplicated, or, in
	// Redlock, by its validity check, redlock.ErrValidity), and writes the
	// resource rejected for a stale token.
	Refused  int `json:"lock_refused"`
	Rejected int `json:"token_rejected"`
	// Expired counts the acquisitions that returned a lease although
	// another worker took the lock on the same register while they were
	// paused inside Acquire (scenario 9): a grant that expired before the
	// caller got it.
	Expired int `json:"expired_grants,omitempty"`
	// Retried counts the writes the database gave up for a conflict with a
	// concurrent transaction (guard.ErrRetry: a PostgreSQL serialization
	// failure or deadlock, SQLITE_BUSY): the worker took a new lease, as
	// after a rejection. Neither accepted nor stale.
	Retried int `json:"retried"`

	// The queue scenario (13), from the effect table: Messages produced,
	// Doubled those applied more than once, Lost those never applied (P3
	// counts both, Ops the messages, Rejected the late commits the fence
	// rejected).
	Messages int `json:"messages,omitempty"`
	Doubled  int `json:"doubled,omitempty"`
	Lost     int `json:"lost,omitempty"`

	Examples []string `json:"examples,omitempty"` // the first few violations, for a person
}

func (v *Verdict) example(format string, args ...any) {
	if len(v.Examples) < 6 {
		v.Examples = append(v.Examples, fmt.Sprintf(format, args...))
	}
}

// refusedByLock reports whether an acquisition's error says the lock
// refused it for safety: replica acknowledgements missing (redislock) or
// no validity time left (redlock).
func refusedByLock(err string) bool {
	return strings.Contains(err, fence.ErrNotReplicated.Error()) || strings.Contains(err, redlock.ErrValidity.Error())
}

// lease is one acquisition as the history shows it.
type lease struct {
	op, worker, key  string
	token            int64
	invoke, acquired int64 // monotonic ns
	end              int64 // release invoked, or the worker's last event
}

// acceptedBefore returns, for each entry of log, the greatest token the
// resource had accepted for its key before it: an accepted entry with a
// smaller token is a stale accept (P1).
func acceptedBefore(log []Entry) []int64 {
	top := map[string]int64{}
	out := make([]int64, len(log))
	for i, e := range log {
		out[i] = top[e.Key]
		if e.Accepted {
			top[e.Key] = max(top[e.Key], e.Token)
		}
	}
	return out
}

// Check judges a history against the resource's log and final state.
func Check(events []Event, log []Entry, state map[string][]string) Verdict {
	var v Verdict
	leases := map[string]*lease{}
	lastOf := map[string]int64{}
	writes := map[string]string{} // op → final phase of its write
	for _, e := range events {
		lastOf[e.Worker] = max(lastOf[e.Worker], e.Mono)
		switch {
		case e.Kind == "acquire" && e.Phase == "invoke":
			leases[e.Op] = &lease{op: e.Op, worker: e.Worker, key: e.Key, invoke: e.Mono}
		case e.Kind == "acquire" && e.Phase == "fail" && refusedByLock(e.Err):
			v.Refused++
		case e.Kind == "acquire" && e.Phase == "ok":
			if l := leases[e.Op]; l != nil {
				l.token, l.acquired = e.Token, e.Mono
			}
		case e.Kind == "release" && e.Phase == "invoke":
			if l := leases[e.Op]; l != nil {
				l.end = e.Mono
			}
		case e.Kind == "write" && e.Phase == "invoke":
			v.Ops++
			writes[e.Op] = "unknown"
		case e.Kind == "write":
			writes[e.Op] = e.Phase
		}
	}
	registers := map[string]bool{}
	for _, l := range leases {
		registers[l.key] = true
	}
	v.Registers = len(registers)
	var held []*lease
	for _, l := range leases {
		if l.acquired == 0 {
			continue
		}
		if l.end == 0 {
			l.end = lastOf[l.worker]
		}
		held = append(held, l)
	}
	sort.Slice(held, func(i, j int) bool { return held[i].acquired < held[j].acquired })

	// P1, from the resource's own log.
	before := acceptedBefore(log)
	for i, e := range log {
		switch {
		case !e.Accepted:
			v.Rejected++
		case e.Token < before[i]:
			v.P1++
			v.example("P1: %s %s by %s with token %d accepted after token %d", e.Kind, e.Op, e.Worker, e.Token, before[i])
		}
	}

	// P2 and P4, over pairs of leases on the same register.
	twice := map[string]bool{}
	for i, b := range held {
		bad := false
		for _, a := range held[:i] {
			if a.key != b.key {
				continue
			}
			if a.token == b.token || (a.acquired < b.invoke && a.token >= b.token) {
				bad = true
			}
			if a.end > b.acquired {
				v.P4++
				twice[b.key] = true
			}
		}
		if bad {
			v.P2++
			v.example("P2: %s got token %d, not above an earlier lease's", b.op, b.token)
		}
	}

	v.TwoHolders = len(twice)

	// Expired grants: a pause inside Acquire (before the acquisition
	// completed) during which another worker took the lock.
	paused := map[string][]int64{}
	for _, e := range events {
		if e.Kind == "pause" && e.Phase == "invoke" {
			paused[e.Op] = append(paused[e.Op], e.Mono)
		}
	}
	for _, l := range held {
		for _, p := range paused[l.op] {
			if p < l.invoke || p > l.acquired {
				continue
			}
			for _, o := range held {
				if o.worker != l.worker && o.key == l.key && o.acquired > p && o.acquired < l.acquired {
					v.Expired++
					v.example("expired grant: %s got its lease after %s took the lock during its pause", l.op, o.op)
					break
				}
			}
		}
	}

	// P3, against the final state.
	count := map[string]int{}
	for _, ops := range state {
		for _, op := range ops {
			count[op]++
		}
	}
	ops := make([]string, 0, len(writes))
	for op := range writes {
		ops = append(ops, op)
	}
	sort.Strings(ops)
	for _, op := range ops {
		n := count[op]
		switch phase := writes[op]; {
		case phase == "ok" && n != 1:
			v.P3++
			v.example("P3: acknowledged write %s is in the final state %d times", op, n)
		case phase == "fail" && n != 0:
			v.P3++
			v.example("P3: failed write %s is in the final state", op)
		case phase == "unknown" && n > 1:
			v.P3++
			v.example("P3: write %s of unknown outcome is in the final state %d times", op, n)
		}
	}
	return v
}
