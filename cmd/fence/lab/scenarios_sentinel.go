package lab

import (
	"fmt"
	"syscall"
	"time"

	"github.com/fencekit/fence/internal/redisserver"
)

// sentinelFailover is scenario 12: scenario 4's fault with Redis Sentinel
// doing the failover. Each round starts a primary, one replica and three
// sentinels (quorum 2, down-after-milliseconds 1000, failover-timeout
// 3000), and the workers reach the primary through the sentinels
// (redis.NewFailoverClient), as clients of a Sentinel deployment do. One
// acquisition on the primary records its replica; then the replica's link
// is cut, worker A locks through the sentinels and pauses, the primary is
// killed and the replica continued, and the sentinels, not the lab, promote
// it; worker B locks through them on the promoted node and writes, and A
// comes back and writes. The control is fence's lock with replica sync off
// and plain writes; protected is fence's defaults and guard.
func sentinelFailover(x *experiment) error {
	x.fenceControl = true
	for r := range x.scale(1, 10) {
		if err := x.sentinelRound(r); err != nil {
			return fmt.Errorf("round %d: %w", r, err)
		}
	}
	return nil
}

func (x *experiment) sentinelRound(r int) error {
	key := fmt.Sprintf("payment:%d", 1001+r)
	primary, replicas, err := x.replicated(1)
	if err != nil {
		return err
	}
	replica := replicas[0]
	defer replica.Kill()
	sentinels, err := redisserver.StartSentinels(primary, 3)
	if err != nil {
		return err
	}
	defer sentinels.Close()
	x.mu.Lock()
	x.servers = append(x.servers, sentinels.Servers...) // killed by cleanup if the run aborts
	x.mu.Unlock()
	if err := sentinels.WaitReady(1); err != nil {
		return err
	}
	if err := x.warmUp(primary); err != nil {
		return err
	}
	if err := redisserver.CutLink(x.ctx, primary, replica); err != nil {
		return err
	}
	base := Spec{Lock: "lab:" + key, Key: key, TTL: 5 * time.Second,
		Sentinels: sentinels.Addrs(), Master: sentinels.Master,
		NoSync: !x.protected || x.cfg.syncOff}
	a, b := base, base
	a.ID, b.ID = fmt.Sprintf("A%d", r), fmt.Sprintf("B%d", r)
	b.Ops = 20
	return x.failoverRound(a, b, func() error {
		primary.Kill()
		replica.Signal(syscall.SIGCONT)
		promoted, err := sentinels.WaitFailover(primary, replica)
		if err != nil || promoted != replica {
			x.noteOnce(fmt.Sprintf("fault did not bite: the sentinels did not promote the replica in round %d: %v", r, err))
		}
		return nil
	})
}
