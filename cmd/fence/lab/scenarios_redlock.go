package lab

import (
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/fencekit/fence/cmd/fence/lab/worker"
	"github.com/fencekit/fence/internal/redisserver"
	"github.com/fencekit/fence/redlock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// redlockNodes starts n independent redis-servers without persistence
// (the lab's servers run with save "" and no AOF), the masters of a
// Redlock.
func (x *experiment) redlockNodes(n int) ([]*redisserver.Server, error) {
	var nodes []*redisserver.Server
	for range n {
		s, err := x.redis()
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, s)
	}
	return nodes, nil
}

// links gives each node a link of its own through an in-process toxiproxy,
// as a worker on another host reaches it; partition lists the nodes whose
// links are cut: a timeout toxic without a timeout holds every byte sent,
// so requests to those nodes are never answered (the lock's per-node
// timeout gives up on them). It returns the addresses to reach the nodes
// by and a function that stops the proxies.
func (x *experiment) links(api *toxiproxy.ApiServer, name string, nodes []*redisserver.Server, partition ...int) ([]string, func(), error) {
	var addrs []string
	var proxies []*toxiproxy.Proxy
	stop := func() {
		for _, p := range proxies {
			p.Stop()
		}
	}
	for i, n := range nodes {
		p := toxiproxy.NewProxy(api, fmt.Sprintf("%s-%d", name, i), "127.0.0.1:0", n.Addr)
		if err := p.Start(); err != nil {
			stop()
			return nil, nil, fmt.Errorf("toxiproxy: %w", err)
		}
		proxies = append(proxies, p)
		if contains(partition, i) {
			const cut = `{"name":"partition","type":"timeout","stream":"upstream","toxicity":1,"attributes":{"timeout":0}}`
			if _, err := p.Toxics.AddToxicJson(strings.NewReader(cut)); err != nil {
				stop()
				return nil, nil, fmt.Errorf("toxiproxy partition: %w", err)
			}
		}
		addrs = append(addrs, p.Listen)
	}
	return addrs, stop, nil
}

func addrsOf(nodes []*redisserver.Server) []string {
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.Addr)
	}
	return addrs
}

// redlockRound is one round of scenarios 7 and 8, Kleppmann's Redlock
// argument with five nodes N0…N4: worker A reaches N0–N2 and not N3, N4
// (its links to them are cut), so its lease rests on N0, N1, N2; it
// pauses once it holds it. fault then makes N2 forget the lock, and worker
// B, whose links to the nodes in partitionB (if any) are cut, takes the
// lock on N2, N3, N4 while A's lease is still valid: two holders. B
// writes, A continues and writes.
// Both run fence's redlock with its defaults: the control writes with a
// plain UPDATE, protected with guard.
func (x *experiment) redlockRound(r int, fault func(key string, nodes []*redisserver.Server) error, partitionB ...int) error {
	key := fmt.Sprintf("payment:%d", 1001+r)
	nodes, err := x.redlockNodes(5)
	if err != nil {
		return err
	}
	defer func() {
		for _, n := range nodes {
			n.Kill()
		}
	}()
	api := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	aAddrs, stopA, err := x.links(api, "A", nodes, 3, 4)
	if err != nil {
		return err
	}
	defer stopA()
	bAddrs := addrsOf(nodes)
	if len(partitionB) > 0 {
		var stopB func()
		if bAddrs, stopB, err = x.links(api, "B", nodes, partitionB...); err != nil {
			return err
		}
		defer stopB()
	}
	base := Spec{Lock: "lab:" + key, Key: key, TTL: 5 * time.Second}
	a, b := base, base
	// A waits, as B does: a first try on a busy machine (a dial, a
	// NOSCRIPT and the script on each node) can miss the per-node timeout.
	a.ID, a.Redlock, a.Wait = fmt.Sprintf("A%d", r), aAddrs, 10*time.Second
	b.ID, b.Redlock = fmt.Sprintf("B%d", r), bAddrs
	b.Ops = x.scale(10, 20)
	return x.failoverRound(a, b, func() error {
		if held := lockedOn(x, nodes, a.Lock); !equalInts(held, []int{0, 1, 2}) {
			x.noteOnce(fmt.Sprintf("fault did not bite: in round %d A's lock is on nodes %v, not on N0, N1, N2", r, held))
		}
		if x.cfg.skipFault {
			return nil
		}
		return fault(a.Lock, nodes)
	})
}

// redlockKey is the key of lock name on a Redlock node, under redlock's
// default prefix.
func redlockKey(name string) string { return redlock.DefaultPrefix + ":{" + name + "}" }

// lockedOn lists the nodes that hold lock name.
func lockedOn(x *experiment, nodes []*redisserver.Server, name string) []int {
	var on []int
	for i, n := range nodes {
		c := redis.NewClient(&redis.Options{Addr: n.Addr})
		if c.Exists(x.ctx, redlockKey(name)).Val() == 1 {
			on = append(on, i)
		}
		c.Close()
	}
	return on
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// redlockRestart is scenario 7: a Redlock node restarted at once without
// persistence right after a grant. A holds the lock on N0, N1, N2; N2 is
// killed and started again, empty; B, reaching every node, is granted
// N2, N3, N4 (N0 and N1 answer that A holds it). The restarted node
// issues B's token from its clock floor (max(last + 1, its clock, the
// client's clock a second ahead)): greater than A's, so guard rejects A's
// late write. The control's plain UPDATE accepts it.
func redlockRestart(x *experiment) error {
	x.fenceControl = true
	for r := range x.scale(1, 10) {
		err := x.redlockRound(r, func(_ string, nodes []*redisserver.Server) error {
			return nodes[2].Restart()
		})
		if err != nil {
			return fmt.Errorf("round %d: %w", r, err)
		}
	}
	return nil
}

// redlockClockJump is scenario 8: a clock jump on one Redlock node,
// emulated at the data level (libfaketime does not work with Debian's
// redis-server): PEXPIRE on N2's lock key lets A's lock there expire at
// once, as a node whose clock jumped forward would. B is partitioned from
// N0 and N1 (the network splits A's side from B's) and is granted N2,
// N3, N4. N2's token record survived, and it saw A's token (it issued it,
// or A wrote it back), so it issues B a greater one: guard rejects A's
// late write, the control's plain UPDATE accepts it.
func redlockClockJump(x *experiment) error {
	x.fenceControl = true
	for r := range x.scale(1, 10) {
		err := x.redlockRound(r, func(lock string, nodes []*redisserver.Server) error {
			c := redis.NewClient(&redis.Options{Addr: nodes[2].Addr})
			defer c.Close()
			ok, err := c.PExpire(x.ctx, redlockKey(lock), time.Millisecond).Result()
			if err != nil {
				return err
			}
			if !ok {
				x.noteOnce(fmt.Sprintf("fault did not bite: N2 held no lock %s to expire in round %d", lock, r))
			}
			return nil
		}, 0, 1)
		if err != nil {
			return fmt.Errorf("round %d: %w", r, err)
		}
	}
	return nil
}

// pausedAcquisition is scenario 9: worker A stops itself inside Acquire,
// between sending its requests and the lock reading the replies (a
// go-redis hook in the worker, worker.PauseReplies: the library runs
// unchanged), once every node has granted; B waits for the lock, takes it
// once A's grants have expired and writes; then A continues. Protected is
// fence's redlock with its defaults on three nodes: it must refuse A's
// acquisition by its validity check (redlock.ErrValidity), since the
// grants took longer than the lease time. The control is the naive lock
// (SET NX PX on N0, which checks no time) paused the same way: it hands A
// a lease that expired during the pause while B held the lock, and A
// writes.
func pausedAcquisition(x *experiment) error {
	for r := range x.scale(1, 10) {
		key := fmt.Sprintf("payment:%d", 1001+r)
		nodes, err := x.redlockNodes(3)
		if err != nil {
			return err
		}
		base := Spec{Lock: "lab:" + key, Key: key, TTL: 300 * time.Millisecond,
			Redis: nodes[0].Addr, Redlock: addrsOf(nodes)}
		a, b := base, base
		// A's first lease warms its connections and loads the scripts,
		// so that its second acquisition, the paused one, is one round
		// trip per node, well inside the per-node timeout; it tries once.
		a.ID, a.Ops, a.PauseAt, a.PausePoint = fmt.Sprintf("A%d", r), 2, []int{2}, worker.PauseReplies
		b.ID, b.Ops, b.Wait = fmt.Sprintf("B%d", r), x.scale(10, 20), 10*time.Second
		if x.cfg.skipFault {
			a.PauseAt = nil
		}
		if err := x.pausedAcquisitionRound(a, b); err != nil {
			return fmt.Errorf("round %d: %w", r, err)
		}
		for _, n := range nodes {
			n.Kill()
		}
	}
	return nil
}

func (x *experiment) pausedAcquisitionRound(a, b Spec) error {
	wa, err := x.spawn(a)
	if err != nil {
		return err
	}
	op := fmt.Sprintf("%s-%d", a.ID, a.Ops) // the paused acquisition, A's last
	pause, ok := x.waitEvent(func(e Event) bool {
		return e.Op == op && (e.Kind == "pause" || e.Kind == "acquire" && e.Phase != "invoke")
	}, 15*time.Second)
	if !ok {
		return fmt.Errorf("worker %s neither paused nor finished its acquisition %s", a.ID, op)
	}
	if pause.Kind != "pause" {
		x.noteOnce(fmt.Sprintf("fault did not bite: acquisition %s ended without the pause (%s %s)", op, pause.Phase, pause.Err))
	}
	wb, err := x.spawn(b)
	if err != nil {
		return err
	}
	if err := wb.wait(time.Minute); err != nil {
		return err
	}
	wa.signal(syscall.SIGCONT)
	if err := wa.wait(time.Minute); err != nil {
		return err
	}
	// The fault bit if B took the lock while A was paused.
	var took bool
	var outcome Event
	for _, e := range x.hist.Events() {
		if e.Worker == b.ID && e.Kind == "acquire" && e.Phase == "ok" && e.Mono > pause.Mono {
			took = true
		}
		if e.Op == op && e.Kind == "acquire" && e.Phase != "invoke" {
			outcome = e
		}
	}
	if !took {
		x.noteOnce(fmt.Sprintf("fault did not bite: %s never took the lock while %s was paused", b.ID, a.ID))
	}
	if x.protected && outcome.Phase == "fail" && !strings.Contains(outcome.Err, redlock.ErrValidity.Error()) {
		x.noteOnce(fmt.Sprintf("%s's acquisition was refused, but not by the validity check: %s", a.ID, outcome.Err))
	}
	return nil
}
