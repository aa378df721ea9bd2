package lab

import (
	"fmt"
	"strings"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/fencekit/fence/internal/redisserver"
	"github.com/fencekit/fence/redislock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// delayedWrite is scenario 2: the resource is served over HTTP (guard's
// Middleware with a SQLStore, protected; a plain handler, control), and
// one worker reaches it through an in-process toxiproxy that delays every
// request by twice the lease time, so its read-modify-write arrives after
// its lease has expired and another worker has taken the lock. The other
// two reach the resource directly.
func delayedWrite(x *experiment) error {
	srv, err := x.redis()
	if err != nil {
		return err
	}
	api := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	proxy := toxiproxy.NewProxy(api, "victim", "127.0.0.1:0", x.res.Addr())
	if err := proxy.Start(); err != nil {
		return fmt.Errorf("toxiproxy: %w", err)
	}
	defer proxy.Stop()
	const ttl = 200 * time.Millisecond
	toxic := fmt.Sprintf(`{"name":"late","type":"latency","stream":"upstream","toxicity":1,"attributes":{"latency":%d}}`, 2*ttl.Milliseconds())
	if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
		return fmt.Errorf("toxiproxy latency: %w", err)
	}
	base := Spec{Redis: srv.Addr, Lock: "lab:payment:1001", Key: "payment:1001", TTL: ttl, Wait: 20 * time.Second}
	victim, other := base, base
	victim.ID, victim.Ops, victim.Resource, victim.Think = "w1", x.scale(3, 20), proxy.Listen, 5*time.Millisecond
	other.Resource, other.Think = x.res.Addr(), 10*time.Millisecond
	if err := x.runWithOthers(victim, other); err != nil {
		return err
	}
	x.checkOverlapped("w1")
	return nil
}

// wrongReplica is scenario 5: a primary with two replicas, both recorded by
// an acquisition before the fault; the second replica's link is cut, so
// WAIT is met by the first alone; then the primary and the first replica
// die and the second is promoted. Under fence's default rule (one replica)
// worker A got the lock, and B takes it again on the promoted replica. The
// control is fence's lock with the defaults and writes that ignore
// tokens; protected is the defaults and guard; the variant "acks=all" asks
// every expected replica to acknowledge.
func wrongReplica(x *experiment) error {
	x.fenceControl = true
	rounds := x.scale(2, 20)
	acks := 0
	if x.variant == "acks=all" {
		acks = redislock.AcksAll
	}
	for r := range rounds {
		key := fmt.Sprintf("payment:%d", 1001+r)
		primary, replicas, err := x.replicated(2)
		if err != nil {
			return err
		}
		if err := x.warmUp(primary); err != nil {
			return err
		}
		r1, r2 := replicas[0], replicas[1]
		if err := redisserver.CutLink(x.ctx, primary, r2); err != nil {
			return err
		}
		base := Spec{Lock: "lab:" + key, Key: key, TTL: 5 * time.Second}
		a, b := base, base
		a.ID, a.Redis, a.Acks = fmt.Sprintf("A%d", r), primary.Addr, acks
		b.ID, b.Redis = fmt.Sprintf("B%d", r), r2.Addr
		err = x.failoverRound(a, b, func() error {
			primary.Kill()
			r1.Kill()
			return redisserver.Promote(x.ctx, r2)
		})
		if err != nil {
			return fmt.Errorf("round %d: %w", r, err)
		}
		r2.Kill()
	}
	return nil
}

// checkOverlapped notes a run in which some write of worker id reached
// the resource without another worker having taken the lock since id's
// lease began: the delay did not bite.
func (x *experiment) checkOverlapped(id string) {
	evs := x.hist.Events()
	var acquired int64
	for _, e := range evs {
		if e.Worker != id {
			continue
		}
		switch {
		case e.Kind == "acquire" && e.Phase == "ok":
			acquired = e.Mono
		case e.Kind == "write" && e.Phase != "invoke":
			overlapped := false
			for _, o := range evs {
				if o.Worker != id && o.Kind == "acquire" && o.Phase == "ok" && o.Mono > acquired && o.Mono < e.Mono {
					overlapped = true
					break
				}
			}
			if !overlapped {
				x.noteOnce(fmt.Sprintf("fault did not bite: %s's write %s completed before anyone else took the lock", id, e.Op))
			}
		}
	}
}
