package redislock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencekit/fence"
	"github.com/redis/go-redis/v9"
)

// HiddenClusterError is the error, matching fence.ErrInvalidOption, of
// every acquisition and renewal of a Locker with replica sync on whose
// client is a UniversalClient of a type redislock cannot identify (a
// struct of the caller's that embeds the redis.UniversalClient interface,
// say, which has no Options method to tell what it holds, or one that
// reports *redis.Options other than those of a *redis.Client it embeds)
// and that spreads commands over several servers: its server says it is a Redis Cluster
// node, or keys with different hash tags reached different servers (a
// Ring). Such a client (a cluster client, a Ring) sends replica sync's
// key-less WAIT to a node or shard of its own choosing, not on the
// connection that ran the script, where it counts nothing that connection
// wrote: acquisitions would be confirmed as replicated unchecked. Acquire
// wraps it in an error matching fence.ErrNotAcquired; nothing is taken,
// and a waiting Acquire ends at once. Pass the *redis.ClusterClient or
// *redis.Ring itself, or disable replica sync.
type HiddenClusterError struct {
	Client string // the client's type, as %T prints it
	Detail string // what gave it away
}

// Error says what was refused and what to pass instead.
func (e *HiddenClusterError) Error() string {
	return fmt.Sprintf("redislock: the client, a %s, is of a type redislock cannot identify, and %s: a cluster client or a Ring sends replica sync's WAIT to a node of its choosing, not on the connection that ran the script; pass the *redis.ClusterClient or *redis.Ring itself, or disable replica sync", e.Client, e.Detail)
}

// Unwrap makes the error match fence.ErrInvalidOption.
func (e *HiddenClusterError) Unwrap() error { return fence.ErrInvalidOption }

// clusterProbe is what a Locker on an opaque client learnt from its server:
// whether it is a cluster node (refusal set) or not, once done. A refusal
// is kept; an answer of one server is asked again once it is
// replicaReadEvery old (at, on the replica cache's clock): a hidden Ring
// of one shard, or one whose other shards were down, may spread its keys
// later (TestHiddenRingGrows).
type clusterProbe struct {
	mu      sync.Mutex // held while the server is asked: one probe at a time
	done    atomic.Bool
	at      atomic.Int64 // when the answer was had, unix ns
	refusal atomic.Pointer[HiddenClusterError]
}

// fresh reports whether the probe has an answer, and one not to ask again
// yet at now: a refusal, or one server found less than replicaReadEvery ago.
func (p *clusterProbe) fresh(now time.Time) bool {
	return p.done.Load() && (p.refusal.Load() != nil || now.UnixNano()-p.at.Load() < int64(replicaReadEvery))
}

// opaqueClient reports whether client is a UniversalClient of a type that
// redislock cannot tell for a single server's: not a *redis.Client (plain
// or Sentinel failover), nor a type embedding one (which reports its
// *redis.Options), nor a cluster client or a Ring (which the Locker routes
// by itself; New refuses types embedding them). A struct embedding the
// redis.UniversalClient interface is one, whatever it holds, and so is a
// go-redis AutoPipeliner (refused by New with replica sync on).
//
// A type that reports *redis.Options without being, or embedding, the
// *redis.Client whose options they are is opaque too: a program's wrapper
// of redis.NewUniversalClient may report UniversalOptions.Simple() around
// a cluster client (TestOptionsReportingClusterWrapper: 3 of 5
// acquisitions confirmed with the slot master's replica paused).
func opaqueClient(client redis.UniversalClient) bool {
	switch c := client.(type) {
	case nil, *redis.Client, *redis.ClusterClient, *redis.Ring:
		return false
	case interface{ Options() *redis.Options }:
		return !embedsClientWith(client, c.Options(), 0)
	}
	return true
}

// embedsClientWith reports whether v is, or points to, a struct that
// embeds (up to 8 deep) a non-nil *redis.Client whose options are o.
func embedsClientWith(v any, o *redis.Options, depth int) bool {
	if depth > 8 {
		return false
	}
	rv := reflect.ValueOf(v)
	for rv.Kind() == reflect.Pointer || rv.Kind() == reflect.Interface {
		if rv.IsNil() {
			return false
		}
		rv = rv.Elem()
	}
	if rv.Kind() != reflect.Struct {
		return false
	}
	for i := range rv.NumField() {
		f := rv.Field(i)
		if !rv.Type().Field(i).Anonymous || !f.CanInterface() {
			continue
		}
		if c, ok := f.Interface().(*redis.Client); ok {
			if c != nil && c.Options() == o {
				return true
			}
			continue
		}
		if embedsClientWith(f.Interface(), o, depth+1) {
			return true
		}
	}
	return false
}

// hiddenCluster returns, for a Locker on an opaque client, the
// *HiddenClusterError when the client spreads commands over several
// servers, asking (one round trip, see probeCluster) the first time: a
// refusal is kept, and an answer of one server for replicaReadEvery (as
// the expected replica count is), then asked again; calls in between cost
// two atomic loads and a clock read. An error of the question itself (the
// server unreachable) is returned and not kept; the next call asks again.
// On any other client it returns nil at once.
//
// It must run before anything replica sync sends through the client: the
// replica record's script would run on the node that owns the record's
// key, not the lock's, and count that node's replicas.
func (l *Locker) hiddenCluster(ctx context.Context) error {
	if !l.opaque {
		return nil
	}
	p := &l.probe
	if !p.fresh(l.replicas.now()) {
		if err := l.probeCluster(ctx); err != nil {
			return err
		}
	}
	if e := p.refusal.Load(); e != nil {
		return e
	}
	return nil
}

// hiddenClusterSynced is hiddenCluster with replica sync on, nil with it
// off: ReplicaCounts and SetExpectedReplicas, which would read or write
// the record of the node that owns its key rather than the lock's, refuse
// as acquisitions do, and with sync off behave as before.
func (l *Locker) hiddenClusterSynced(ctx context.Context) error {
	if l.sync.Disabled {
		return nil
	}
	return l.hiddenCluster(ctx)
}

// probeKeys is how many keys, with random hash tags, the probe's scripts
// run on: a client that spreads keys over several servers (a Ring, a
// cluster client) sends them to more than one, but for odds of 2^-31.
const probeKeys = 32

// probeScript returns the run_id of the server it runs on; it reads its
// key's slot, writes nothing, and says so (no-writes): a primary that
// pauses writes (CLIENT PAUSE WRITE, a switchover) holds back a script
// that declares no flags for the whole pause, and with it the first
// ReplicaCounts, or Status's counts, of a Locker on such a client
// (TestFirstStatusDuringWritePauseWrapped).
var probeScript = "#!lua flags=no-writes\nreturn string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or ''"

// probeCluster asks, unless another call has, whether the client spreads
// commands over several servers, in one pipeline: INFO server and cluster
// (a cluster node says cluster_enabled:1 whichever one answers; run_id
// names the server that key-less commands in a pipeline reach) and a
// script on each of probeKeys keys that returns its server's run_id (a
// Ring's shards are standalone servers, so only where its commands go
// tells it). A client of one server answers one run_id.
func (l *Locker) probeCluster(ctx context.Context) error {
	p := &l.probe
	p.mu.Lock()
	defer p.mu.Unlock()
	at := l.replicas.now()
	if p.fresh(at) {
		return nil
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	tag := hex.EncodeToString(b[:])
	pipe := l.client.Pipeline()
	// INFO is what the replica record's script reads anyway, so an ACL
	// that allows replica sync allows it, and the scripts.
	info := pipe.Info(ctx, "server", "cluster")
	ids := make([]*redis.Cmd, probeKeys)
	for i := range ids {
		ids[i] = pipe.Eval(ctx, probeScript, []string{fmt.Sprintf("%s:{probe:%s:%d}", l.prefix, tag, i)})
	}
	_, err := pipe.Exec(ctx)
	if err != nil && redis.HasErrorPrefix(info.Err(), "NOPERM") {
		// An ACL without INFO (+@all -@dangerous, say), which sets
		// ReplicaSync.Replicas: ask without it.
		if err = l.probeWithoutInfo(ctx, tag); err == nil {
			p.at.Store(at.UnixNano())
			p.done.Store(true)
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("redislock: ask the server(s) of a %T whether it is a cluster node or several servers (replica sync must know): %w", l.client, err)
	}
	servers := make(map[string]struct{})
	for _, cmd := range ids {
		servers[fmt.Sprint(cmd.Val())] = struct{}{}
	}
	// The key-less INFO went where a key-less WAIT in a pipeline goes:
	// its server must be the keys' one.
	if id := infoField(info.Val(), "run_id"); id != "" {
		servers[id] = struct{}{}
	}
	switch {
	case clusterEnabled(info.Val()):
		p.refusal.Store(l.clusterNodeRefusal())
	case len(servers) > 1:
		p.refusal.Store(&HiddenClusterError{Client: fmt.Sprintf("%T", l.client), Detail: fmt.Sprintf("its commands (a key-less one and %d with keys) reached %d servers (by run_id), as a Ring's do", probeKeys, len(servers))})
	}
	p.at.Store(at.UnixNano())
	p.done.Store(true)
	return nil
}

func (l *Locker) clusterNodeRefusal() *HiddenClusterError {
	return &HiddenClusterError{Client: fmt.Sprintf("%T", l.client), Detail: "its server is a Redis Cluster node"}
}

// probeMarkScript returns the mark of the server it runs on: the value of
// ARGV[1], a key it does not declare (so that it is not routed by it: the
// server it runs on is the one that KEYS[1], or for none the key-less
// command, reached), which the first run on that server sets to ARGV[2],
// a random value of the run's own, followed by the server's time; the
// mark expires in a minute.
var probeMarkScript = "redis.call('SET', ARGV[1], ARGV[2] .. ':' .. table.concat(redis.call('TIME'), '.'), 'NX', 'PX', 60000) return redis.call('GET', ARGV[1])"

// probeWithoutInfo is probeCluster for a user whose ACL refuses INFO
// (@dangerous), in one pipeline of commands outside @dangerous: HELLO
// (key-less; its mode says whether the server it reached is a cluster
// node, as INFO's cluster_enabled does) and probeMarkScript, key-less and
// on each of probeKeys keys, in place of the probe script (which returns
// the server's run_id from INFO). The mark is new (tag is the probe's,
// random), and each run proposes a value no other run does: every server
// the scripts reach keeps the value of the first run there, so one server
// answers one mark and several answer as many (a pipeline sent again
// finds the marks its first copy set). A server that says anything but
// standalone, or a reply that is not as expected, is an error: the probe
// cannot tell, and fails closed.
func (l *Locker) probeWithoutInfo(ctx context.Context, tag string) error {
	pipe := l.client.Pipeline()
	hello := pipe.Do(ctx, "HELLO")
	mark := fmt.Sprintf("%s:{probe:%s}:mark", l.prefix, tag)
	marks := make([]*redis.Cmd, probeKeys+1)
	var b [8]byte
	for i := range marks {
		_, _ = rand.Read(b[:])
		var keys []string // the first key-less
		if i > 0 {
			keys = []string{fmt.Sprintf("%s:{probe:%s:%d}", l.prefix, tag, i)}
		}
		marks[i] = pipe.Eval(ctx, probeMarkScript, keys, mark, hex.EncodeToString(b[:]))
	}
	_, err := pipe.Exec(ctx)
	mode, merr := helloMode(hello)
	switch {
	case merr == nil && mode == "cluster":
		// Whatever the scripts did (a cluster node refuses a key a
		// script does not declare): the key-less HELLO reached a node.
		l.probe.refusal.Store(l.clusterNodeRefusal())
		return nil
	case merr != nil:
		return fmt.Errorf("HELLO, as INFO is refused: %w", merr)
	case mode != "standalone":
		return fmt.Errorf("HELLO, as INFO is refused, says mode %q: neither standalone nor cluster", mode)
	case err != nil:
		return err
	}
	servers := make(map[string]struct{})
	for _, cmd := range marks {
		m, err := cmd.Text()
		if err != nil || m == "" {
			return fmt.Errorf("the probe's mark: %q, %v", m, err)
		}
		servers[m] = struct{}{}
	}
	if len(servers) > 1 {
		l.probe.refusal.Store(&HiddenClusterError{Client: fmt.Sprintf("%T", l.client), Detail: fmt.Sprintf("its commands (a key-less one and %d with keys) reached %d servers (by a mark that each keeps), as a Ring's do", probeKeys, len(servers))})
	}
	return nil
}

// helloMode returns the mode field of HELLO's reply: a map (RESP3) or a
// flat list of fields and values (RESP2).
func helloMode(hello *redis.Cmd) (string, error) {
	v, err := hello.Result()
	if err != nil {
		return "", err
	}
	var mode any
	switch v := v.(type) {
	case map[any]any:
		mode = v["mode"]
	case []any:
		for i := 0; i+1 < len(v); i += 2 {
			if v[i] == "mode" {
				mode = v[i+1]
			}
		}
	}
	s, ok := mode.(string)
	if !ok {
		return "", fmt.Errorf("no mode in its reply %v", v)
	}
	return s, nil
}

// clusterEnabled reads cluster_enabled from INFO cluster (or from INFO
// replies of several nodes, as a cluster client may merge them).
func clusterEnabled(info string) bool {
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k == "cluster_enabled" && v != "0" {
			return true
		}
	}
	return false
}

// infoField returns the value of field in an INFO reply, "" if absent.
func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k == field {
			return v
		}
	}
	return ""
}
