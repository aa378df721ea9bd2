package worker

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// replyPause stops the worker inside Acquire, between sending the
// acquisition's requests and the lock reading the replies: a client paused
// by a GC or a stalled VM at the worst moment of the algorithm, as far as
// everyone else can tell. It is a go-redis hook on every node's client, so
// the lock under test runs unchanged: no test hook in the library.
//
// Armed for one op, it holds back the replies to the acquisition's requests
// (redlock's acquire script, by the try's owner id, or the naive lock's
// SET NX) as go-redis reads them off the sockets, until every node has
// answered; then it stops the process (SIGSTOP, as Spec.PauseAt) until the
// controller continues it, and lets the replies go on their way. So when
// the pause begins every node has granted, and the lock has read none of
// the replies: it cannot decide before the pause, even one that decides as
// soon as a majority has granted (fence's redlock). Whatever the lock does
// after the pause it does with grants that its nodes have since let expire.
// A reply is held at most until its request's context ends (the lock's
// per-node timeout), so a node that never answers does not hang the lock.
type replyPause struct {
	w     *worker
	nodes int // how many replies make the acquisition's last

	mu       sync.Mutex
	op       string         // the armed op, "" when disarmed
	answered map[string]int // replies read, by try (owner id; "" for the naive lock)
	gate     chan struct{}  // closed once the pause is over
}

// arm arms the pause for op's acquisition; "" disarms it.
func (p *replyPause) arm(op string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.op, p.answered, p.gate = op, map[string]int{}, make(chan struct{})
}

// last counts a reply to try and reports the armed op if it was the
// acquisition's last, disarming it; otherwise, while armed, the gate that
// the last reply's pause opens.
func (p *replyPause) last(try string) (string, bool, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.op == "" {
		return "", false, nil
	}
	p.answered[try]++
	if p.answered[try] < p.nodes {
		return "", false, p.gate
	}
	op := p.op
	p.op = ""
	return op, true, p.gate
}

// acquisition reports whether cmd asks for the lock, and the try it
// belongs to: redlock's acquire script is the only script fence's redlock
// runs with three keys (the lock, the token record, the revocation mark),
// its first argument the try's owner id; the naive lock's is SET … NX.
func acquisition(cmd redis.Cmder) (string, bool) {
	args := cmd.Args()
	switch cmd.Name() {
	case "evalsha", "eval":
		// EVALSHA sha 3 lock token revoked owner ttl floor
		if len(args) >= 7 && fmt.Sprint(args[2]) == "3" {
			return fmt.Sprint(args[6]), true
		}
	case "set":
		for _, a := range args[1:] {
			if s, ok := a.(string); ok && (s == "nx" || s == "NX") {
				return "", true
			}
		}
	}
	return "", false
}

func (p *replyPause) DialHook(next redis.DialHook) redis.DialHook { return next }

func (p *replyPause) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (p *replyPause) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		try, ok := acquisition(cmd)
		if !ok || err != nil {
			return err // a NOSCRIPT before the EVAL that follows, or a node's error
		}
		op, last, gate := p.last(try)
		switch {
		case last:
			p.w.pause(op, 0)
			close(gate)
		case gate != nil:
			select {
			case <-gate:
			case <-ctx.Done():
			}
		}
		return err
	}
}

var _ redis.Hook = (*replyPause)(nil)
