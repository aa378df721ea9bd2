package fencerueidis

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/pause"
	"github.com/fencekit/fence/internal/redisconn"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/rueidis"
)

// New returns a redislock Locker on client, a rueidis client of a
// standalone Redis (or one behind Sentinel), with opts as redislock.New
// takes them; opts may be nil. It needs Redis 7.0 or newer and sends
// nothing to Redis. It returns an error matching fence.ErrInvalidOption
// when client is nil, is a cluster client, is a Sentinel client with
// ReplicaOnly, has a BlockingPoolSize of 1, or an option is out of range.
func New(client rueidis.Client, opts *redislock.Options) (*redislock.Locker, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: fencerueidis: nil client", fence.ErrInvalidOption)
	}
	if client.Mode() == rueidis.ClientModeCluster {
		return nil, fmt.Errorf("%w: fencerueidis: Redis Cluster is not supported; use redislock with go-redis's ClusterClient", fence.ErrInvalidOption)
	}
	if replicaOnly(client) {
		return nil, fmt.Errorf("%w: fencerueidis: a Sentinel client with ReplicaOnly sends every command to a replica, which refuses the lock's writes (READONLY); use one without it", fence.ErrInvalidOption)
	}
	if blockingPoolSize(client) == 1 {
		return nil, fmt.Errorf("%w: fencerueidis: BlockingPoolSize 1: the blocking pool carries replica sync's WAIT, Status's reads and, on a RESP2 client or one that routes to replicas, the waiters' subscription, which left a waiter none to take the lock on; use 2 or more (rueidis's default is %d)", fence.ErrInvalidOption, rueidis.DefaultPoolSize)
	}
	l, err := redisconn.NewLocker(conn{client, new(atomic.Int32), &unsubs{m: make(map[string]chan struct{})}, new(subscribers),
		stopFlag(client), client.Mode() == rueidis.ClientModeSentinel}, opts)
	if err != nil {
		return nil, err
	}
	return l.(*redislock.Locker), nil
}

// conn is redisconn.Conn on a rueidis client.
type conn struct {
	c     rueidis.Client
	proto *atomic.Int32 // the client's RESP version, once Subscribe asked; 0 before
	unsub *unsubs       // UNSUBSCRIBEs under way
	subs  *subscribers  // the shared dedicated subscription connection
	stop  *uint32       // the client's closed flag (see stopFlag); nil if not found
	// sentinel: the client finds its master through Sentinel (see
	// switching).
	sentinel bool
}

// stopFlag returns the flag that client's Close sets (the stop field of
// rueidis's single and Sentinel clients, v1.0.79 and v1.0.80), or nil for
// a client of another shape or package (a wrapper, another rueidis
// version). Its calls do not say that it was closed: closed after a failed
// dial, it answers them with that dial's error (ECONNREFUSED, which redislock
// retries), and the next call finds the closed connection "broken", puts
// it back to be dialed, and dials again; closed while a dial is under way,
// it keeps the new connection (TestClosedAfterTimeout). A parked give-back
// then kept dialing a stopped server for its lease time after Close, and
// an Acquire waited out its budget (TestParkingEndsWithClosedClient).
// TestStopFlagFound pins the field.
func stopFlag(client rueidis.Client) *uint32 {
	v, ok := rueidisStruct(client)
	if !ok {
		return nil
	}
	if f := v.Elem().FieldByName("stop"); f.IsValid() && f.Kind() == reflect.Uint32 {
		return (*uint32)(f.Addr().UnsafePointer())
	}
	// rueidis's standalone client (Standalone.ReplicaAddress) has no flag
	// of its own: its Close closes its replicas, set once by NewClient,
	// with its primary (TestParkingEndsWithClosedStandaloneClient). One
	// with EnableRedirect and no replicas is not seen closed.
	if r := v.Elem().FieldByName("replicas"); r.IsValid() && r.Kind() == reflect.Slice && r.Len() > 0 {
		if e := r.Index(0); e.Kind() == reflect.Pointer && !e.IsNil() && e.Elem().Kind() == reflect.Struct && e.Elem().Type().PkgPath() == rueidisPkg {
			if f := e.Elem().FieldByName("stop"); f.IsValid() && f.Kind() == reflect.Uint32 {
				return (*uint32)(f.Addr().UnsafePointer())
			}
		}
	}
	return nil
}

// rueidisStruct returns client as a pointer to a struct of rueidis's own,
// or false for a client of another shape or package. Only rueidis's own
// types are read: a user's wrapper may have a field of the same name,
// meaning something else and written without atomics
// (TestWrappedClientWithStopField).
func rueidisStruct(client rueidis.Client) (reflect.Value, bool) {
	v := reflect.ValueOf(client)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return v, false
	}
	return v, v.Elem().Type().PkgPath() == rueidisPkg
}

// rueidisPkg is the import path of the types stopFlag and replicaOnly
// read.
var rueidisPkg = reflect.TypeFor[rueidis.Client]().PkgPath()

// replicaOnly reports whether client is rueidis's Sentinel client made
// with ReplicaOnly (its replica field, v1.0.79), which sends every command
// to a replica: every script of the lock then failed READONLY, the Locker
// taking no lock (TestSentinelReplicaOnlyRefused). The client says so
// nowhere else: its Mode is Sentinel and its Nodes one address, as with
// a client of the primary. A wrapper, or another rueidis version without
// the field, is taken at its word.
func replicaOnly(client rueidis.Client) bool {
	v, ok := rueidisStruct(client)
	if !ok || client.Mode() != rueidis.ClientModeSentinel {
		return false
	}
	f := v.Elem().FieldByName("replica")
	return f.IsValid() && f.Kind() == reflect.Bool && f.Bool()
}

// blockingPoolSize returns the size of client's blocking pool (rueidis's
// ClientOption.BlockingPoolSize, 0 for its default), read from rueidis's
// own client types (v1.0.79): the pool of a single client's connection,
// the options of a standalone or Sentinel one; 0 for a client of another
// shape or package, taken at its word. The pool carries replica sync's
// script and WAIT pairs, Status's reads, and, on a RESP2 client or one
// that routes to replicas, the waiters' shared subscription: with one
// connection, a waiter woken by a release waited for the connection its
// own subscription held, and gave up at the end of its budget with the
// lock free (TestBlockingPoolOfOneRefused).
func blockingPoolSize(client rueidis.Client) int {
	v, ok := rueidisStruct(client)
	if !ok {
		return 0
	}
	for _, name := range []string{"opt", "mOpt"} { // standalone, Sentinel
		if o := v.Elem().FieldByName(name); o.IsValid() && o.Type() == reflect.TypeFor[*rueidis.ClientOption]() {
			if o.IsNil() {
				return 0
			}
			return int(o.Elem().FieldByName("BlockingPoolSize").Int())
		}
	}
	// A single client: the cap of its connection's blocking pool.
	c := v.Elem().FieldByName("conn")
	if !c.IsValid() || c.Kind() != reflect.Interface || c.IsNil() {
		return 0
	}
	if c = rueidisField(rueidisField(c.Elem(), "dpool"), "cap"); !c.IsValid() || c.Kind() != reflect.Int {
		return 0
	}
	return int(c.Int())
}

// rueidisField returns the field called name of the rueidis struct that p
// points to, or the zero Value if p is not such a pointer.
func rueidisField(p reflect.Value, name string) reflect.Value {
	if !p.IsValid() || p.Kind() != reflect.Pointer || p.IsNil() || p.Elem().Kind() != reflect.Struct || p.Elem().Type().PkgPath() != rueidisPkg {
		return reflect.Value{}
	}
	return p.Elem().FieldByName(name)
}

// errClosed is a call's error on a closed client.
var errClosed = fmt.Errorf("fencerueidis: %w (%w)", rueidis.ErrClosing, fence.ErrClosed)

// closed reports whether the client was closed (see stopFlag).
func (c conn) closed() bool { return c.stop != nil && atomic.LoadUint32(c.stop) != 0 }

// closedErr is err, made to match fence.ErrClosed when the client was
// closed: a closed client grants no lease and sends no give-back, whatever
// rueidis answered.
func (c conn) closedErr(err error) error {
	if err == nil || errors.Is(err, fence.ErrClosed) || !c.closed() {
		return err
	}
	return fmt.Errorf("%w (%w)", err, fence.ErrClosed)
}

// unsubs are the channels whose UNSUBSCRIBE is under way: a Subscribe to
// one waits for it, so that the server does not get the UNSUBSCRIBE after
// the new SUBSCRIBE (a Locker subscribes again as soon as a waiter comes
// after the last one left) and end the new subscription.
type unsubs struct {
	mu sync.Mutex
	m  map[string]chan struct{}
}

// unsubscribeTimeout bounds an UNSUBSCRIBE after a subscription's end (a
// server that hangs keeps the subscription, as it keeps the connection).
const unsubscribeTimeout = 2 * time.Second

// unsubscribe ends the server's side of a Receive that returned at its
// ctx's end, on on, the client of the Receive's connection (see receive;
// c.c if nil): rueidis (v1.0.79) leaves the channel subscribed on the
// shared connection, so that every lock name ever waited on stayed
// subscribed, and its releases delivered, for the connection's life
// (TestSubscriptionsEndWithWaiters). Another Receive of the same channel
// on the same client (another Locker waiting on the same name) ends with
// it; redislock subscribes again.
func (c conn) unsubscribe(channel string, on rueidis.CommandClient) {
	if on == nil {
		on = c.c
	}
	done := make(chan struct{})
	c.unsub.mu.Lock()
	c.unsub.m[channel] = done
	c.unsub.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), unsubscribeTimeout)
	_ = on.Do(ctx, on.B().Unsubscribe().Channel(channel).Build()).Error()
	cancel()
	c.unsub.mu.Lock()
	if c.unsub.m[channel] == done {
		delete(c.unsub.m, channel)
	}
	c.unsub.mu.Unlock()
	close(done)
}

// unsubscribed waits until no UNSUBSCRIBE of channel is under way, or ctx
// ends.
func (c conn) unsubscribed(ctx context.Context, channel string) error {
	c.unsub.mu.Lock()
	done := c.unsub.m[channel]
	c.unsub.mu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// SelfBounded is false: rueidis ends a command's wait for its reply at
// ctx's deadline, but a reconnection it starts for the command (after an
// earlier command timed out on a hung server) dials and handshakes on its
// own timeouts, 5 s by default, which TestHungServer saw hold Extend. So
// calls with a deadline run on redislock's call goroutines, which it can
// leave; calls without one go straight through.
func (c conn) SelfBounded() bool { return false }

// retries is how many times a call is sent again after errBroken or a
// lost connection: rueidis dials a new connection for the next call.
const retries = 2

func (c conn) Eval(ctx context.Context, s *redisconn.Script, keys []string, args []any, replicas int, timeout time.Duration) (reply any, acked int, err error) {
	if c.closed() {
		return nil, 0, errClosed
	}
	var lost error
	var r refusals
	for tries := 0; ; {
		reply, acked, err = c.eval(ctx, s, keys, args, replicas, timeout)
		if c.switching(ctx, err, &r) {
			continue
		}
		if err != errBroken && !connLost(err) {
			break
		}
		if connLost(err) {
			lost = err
		}
		if tries++; tries > retries {
			break
		}
	}
	return reply, acked, c.closedErr(sentAgain(lost, err))
}

// switchWait bounds how long a Sentinel client's calls are sent again while
// its master refuses them (see switching): a client learns of a failover
// from the +switch-master message of the one sentinel it subscribed to,
// which, if it did not lead the failover, hears of it in the leader's hello
// messages, sent every 2 s; the client then dials the new master. 5 s
// leaves room for a loaded machine. A master that stays down without a
// failover makes a call with no deadline fail after it.
const switchWait = 5 * time.Second

// refusals are a call's refused tries on a Sentinel client.
type refusals struct {
	first time.Time // the first refusal
	n     int
}

// switching reports, after a call's try ended with err, whether to try
// again: on a Sentinel client, a refused connection means that the client's
// master is down and that rueidis has not switched to the new one yet (it
// does when its sentinel tells it, TestReleaseBeforeSentinelSwitch), and
// nothing was sent. It waits a back-off first (25 ms, doubling to 400 ms),
// and says no once ctx would end during it, switchWait after the first
// refusal, or when the client is closed. A Release right after a failover
// otherwise failed with "connection refused" from the dead primary, and the
// lock stayed held for its lease time (TestSentinelFailover, 1 run in 7 on
// a loaded machine).
func (c conn) switching(ctx context.Context, err error, r *refusals) bool {
	if !c.sentinel || !errors.Is(err, syscall.ECONNREFUSED) || c.closed() {
		return false
	}
	now := time.Now()
	if r.first.IsZero() {
		r.first = now
	}
	d := 25 * time.Millisecond << min(r.n, 4)
	r.n++
	if now.Add(d).After(r.first.Add(switchWait)) {
		return false
	}
	if dl, ok := ctx.Deadline(); ok && now.Add(d).After(dl) {
		return false
	}
	return pause.For(ctx, d) && !c.closed()
}

// connLost reports a connection that broke under the call (the server
// closed it: CLIENT KILL, a restart, a failover, a proxy): rueidis does
// not send a command that is not read-only again, where go-redis does
// (MaxRetries), and a Release, an Extend or an Acquire failed with EOF
// where it succeeds on go-redis (TestCallsAfterConnectionsKilled). The
// adapter sends it again, as go-redis does: a Release whose first copy
// ran finds the lock gone, and its owner in the released-by record
// (redislock's release.lua), and returns nil
// (TestReleaseReplyLostWithConnection).
// Not a WAIT lost after its script ran (redisconn.ErrWait): redislock
// gives back what that script took.
func connLost(err error) bool {
	return err != nil && err != errBroken && !errors.Is(err, redisconn.ErrWait) &&
		(errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
			errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE))
}

// sentAgain is the error of a call sent again after lost (nil if it was
// not) that ended with err: a refused connection then does not say that
// nothing was sent, since the first copy may have run (redislock gives
// back after such an error, and not after a refusal), so lost is
// returned, with err's text.
func sentAgain(lost, err error) error {
	if lost != nil && errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("%w (sent again: %v)", lost, err)
	}
	return err
}

func (c conn) eval(ctx context.Context, s *redisconn.Script, keys []string, args []any, replicas int, timeout time.Duration) (any, int, error) {
	sargs := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case string:
			sargs[i] = v
		case int64:
			sargs[i] = strconv.FormatInt(v, 10)
		case int:
			sargs[i] = strconv.Itoa(v)
		default:
			return nil, 0, fmt.Errorf("fencerueidis: script argument %T", a)
		}
	}
	sent := time.Now()
	firstAcked := -1 // the first WAIT's count, when the script is sent again
	// A script sent in full (s.Full) is sent by EVAL from the first try.
	for _, full := range []bool{s.Full, true} {
		if full {
			timeout = redisconn.WaitLeft(timeout, sent, firstAcked, replicas)
		}
		var cmd rueidis.Completed
		switch {
		case s.Full && replicas == 0:
			// A read that must answer while the server holds writes
			// back (see redisconn.Script's Full) goes on a connection
			// of its own: automatic pipelining would put it behind any
			// write in flight on the shared one, and the server reads
			// nothing more from a connection whose command it holds
			// (TestStatusDuringWritePauseBehindWrite). Marked blocking,
			// it takes one from rueidis's blocking pool and waits for
			// it under ctx; Dedicated's wait takes no context, and a
			// Status that redislock left at its deadline went on
			// waiting there while the pool was taken
			// (TestCallsLeaveNoPoolWaitPastDeadline).
			cmd = c.c.B().Arbitrary("EVAL", s.Src, strconv.Itoa(len(keys))).Keys(keys...).Args(sargs...).Blocking()
		case full:
			cmd = c.c.B().Eval().Script(s.Src).Numkeys(int64(len(keys))).Key(keys...).Arg(sargs...).Build()
		default:
			cmd = c.c.B().Evalsha().Sha1(s.SHA).Numkeys(int64(len(keys))).Key(keys...).Arg(sargs...).Build()
		}
		var res, wait rueidis.RedisResult
		if replicas > 0 {
			rs := c.c.DoMulti(ctx, cmd, c.c.B().Wait().Numreplicas(int64(replicas)).Timeout(timeout.Milliseconds()).Build())
			res, wait = rs[0], rs[1]
		} else {
			res = c.c.Do(ctx, cmd)
		}
		if e, ok := rueidis.IsRedisErr(res.Error()); !full && ok && e.IsNoScript() {
			if replicas > 0 {
				if n, err := wait.AsInt64(); err == nil {
					firstAcked = int(n)
				}
			}
			continue
		}
		reply, err := c.value(ctx, res)
		if err != nil || replicas == 0 {
			return reply, 0, err
		}
		acked, err := wait.AsInt64()
		if err != nil {
			if err = c.convErr(ctx, err); err == errBroken {
				return nil, 0, err // sent again, the script with it
			}
			// The script ran: its reply goes back with the error, so
			// that what it took is given back.
			return reply, 0, fmt.Errorf("%w: %w", redisconn.ErrWait, err)
		}
		return reply, int(acked), nil
	}
	panic("unreachable")
}

// value is res in go-redis's shapes.
func (c conn) value(ctx context.Context, res rueidis.RedisResult) (any, error) {
	msg, err := res.ToMessage()
	if err == nil {
		var v any
		if v, err = msg.ToAny(); err == nil {
			return v, nil
		}
	}
	if rueidis.IsRedisNil(err) {
		return nil, nil
	}
	return nil, c.convErr(ctx, err)
}

// errBroken is a call's error when rueidis answers it with another call's
// context error: a connection that a command's deadline closed keeps that
// error as its own, and the commands queued on it get it too. For them it
// means a broken connection, which redislock retries, not a deadline of
// theirs, which it would not.
var errBroken = fmt.Errorf("fencerueidis: connection closed by an earlier command's deadline: %w", io.ErrUnexpectedEOF)

// convErr gives a server's error reply redisconn.Error's shape, an error
// of a broken connection errBroken's (ctx is the call's), and a closed
// client's one that matches fence.ErrClosed (the Locker can grant no more
// leases: fence.Lead stops campaigning on it). rueidis.ErrClosing counts
// as closed only when the client's closed flag says so, or cannot be read:
// the open Sentinel client gives it to a call that picked the connection
// that a switch to a new primary closes, and a watchdog lease then ended
// at once, lost (TestRenewalClosingOnOpenClientKeepsLease).
func (c conn) convErr(ctx context.Context, err error) error {
	if e, ok := rueidis.IsRedisErr(err); ok && !e.IsNil() {
		return redisconn.Error(e.Error())
	}
	if errors.Is(err, rueidis.ErrClosing) && (c.stop == nil || c.closed()) {
		return fmt.Errorf("%w (%w)", err, fence.ErrClosed)
	}
	if (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) && !ended(ctx) {
		return errBroken
	}
	return err
}

// ended reports whether ctx has ended or its deadline has passed (rueidis
// puts the deadline on the socket, whose timer can fire before ctx's).
func ended(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return ctx.Err() != nil || ok && !time.Now().Before(dl)
}

// protoScript returns a map: a map reply on RESP3, a flat array on RESP2.
const protoScript = "return {map={resp=3}}"

func (c conn) Subscribe(ctx context.Context, channel string, ready func(), message func(string)) error {
	return c.closedErr(c.subscribe(ctx, channel, ready, message))
}

func (c conn) subscribe(ctx context.Context, channel string, ready func(), message func(string)) error {
	if c.closed() {
		return errClosed
	}
	if c.proto.Load() == 0 {
		// Which protocol, once, from the shape of a script's map reply:
		// RESP3 gives a map, RESP2 a flat array. CLIENT INFO, asked
		// before, is often denied by ACLs (-client, against CLIENT
		// KILL), and the RESP3 assumed then left a RESP2 client's
		// waiters on rueidis's Receive, unwoken after a killed
		// connection (TestSubscriptionKilledRESP2NoClientInfo). A
		// Locker runs scripts anyway; a server refusing this one leaves
		// the default, RESP3.
		msg, err := c.c.Do(ctx, c.c.B().Eval().Script(protoScript).Numkeys(0).Build()).ToMessage()
		if _, refused := rueidis.IsRedisErr(err); err != nil && !refused {
			return c.convErr(ctx, err)
		}
		if err == nil && !msg.IsMap() {
			c.proto.Store(2)
		} else {
			c.proto.Store(3)
		}
	}
	if c.proto.Load() == 2 || routesToReplicas(c.c) {
		return c.subscribeDedicated(ctx, channel, ready, message)
	}
	if err := c.unsubscribed(ctx, channel); err != nil {
		return err
	}
	hctx := rueidis.WithOnSubscriptionHook(ctx, func(s rueidis.PubSubSubscription) {
		if s.Kind == "subscribe" && s.Channel == channel {
			ready()
		}
	})
	on, err := c.receive(hctx, channel, func(m rueidis.PubSubMessage) { message(m.Message) })
	if ctx.Err() != nil && !errors.Is(err, rueidis.ErrClosing) {
		c.unsubscribe(channel, on)
	}
	if err == nil && ctx.Err() == nil {
		err = redisconn.ErrUnsubscribed
	}
	return c.convErr(ctx, err)
}

// receive is the client's Receive of channel, which also returns a client
// of the connection that it subscribed on (nil if it reached none), for
// its UNSUBSCRIBE: on a client with several replicas that sends read-only
// commands to them, the Receive and an UNSUBSCRIBE through the client each
// went to a replica picked at random, and the subscription stayed where
// the UNSUBSCRIBE did not go (TestUnsubscribeOnReplicaRoutingClient).
func (c conn) receive(ctx context.Context, channel string, fn func(rueidis.PubSubMessage)) (rueidis.CommandClient, error) {
	var on rueidis.CommandClient // set on Receive's goroutine, before it returns
	ctx = rueidis.WithOnReceiveReturnHook(ctx, func(err error, cc rueidis.CommandClient) error {
		on = cc
		return err
	})
	err := c.c.Receive(ctx, c.c.B().Subscribe().Channel(channel).Build(), fn)
	return on, err
}

// routesToReplicas reports whether client may send a command to a replica
// (Standalone.ReplicaAddress or a Sentinel client with SendToReplicas:
// more than one node). rueidis's SUBSCRIBE and UNSUBSCRIBE are read-only,
// so the usual SendToReplicas (cmd.IsReadOnly()) sent a RESP3 waiter's
// subscription, through Receive, to a replica: one that stalls or is cut
// from its primary does not pass the releases on, and the waiter sat on a
// free lock for the holder's TTL or its budget
// (TestWaiterOnReplicaRoutingClient). Dedicate's connections are the
// primary's.
func routesToReplicas(client rueidis.Client) bool { return len(client.Nodes()) > 1 }

// subscribeDedicated is Subscribe on a connection of the primary's own: on
// a client that routes to replicas (see routesToReplicas), and on a RESP2
// client, where rueidis keeps subscriptions on a connection of their own
// whose death its Receive does not survive: it retries on the dead
// connection without subscribing again (rueidis v1.0.79;
// TestSubscriptionKilled). The adapter's waiters share that connection
// (see subscribers), whose hooks report its death; it is closed, not
// given back, so the next Subscribe dials a fresh one.
func (c conn) subscribeDedicated(ctx context.Context, channel string, ready func(), message func(string)) error {
	r := &reader{ready: ready, message: message}
	s := c.subs.join(c, channel, r)
	defer s.leave(channel, r)
	if err := s.subscribe(ctx, channel); err != nil {
		return c.convErr(ctx, err)
	}
	select {
	case <-s.dead:
		return c.convErr(ctx, s.err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// watchClose reports, on the channel it returns, the end of a subscription
// through the client's own Receive to a channel of its own (named at
// random, so that another adapter's UNSUBSCRIBE of its own watch on the
// same client does not end this one; nothing is published on it), which
// ends with rueidis.ErrClosing when the client is closed. rueidis does not
// close a dedicated connection when its client is closed (v1.0.79: the pool
// closes only the connections it holds), so without it a waiter subscribed
// on one went on waiting for a release, up to its whole budget, after its
// client was closed (TestClientClosedUnderWaiter), where go-redis's and
// RESP3's subscriptions end at once. The watch ends with ctx; it costs a
// subscription on the client's RESP2 pub/sub connection, no command. A
// Receive that ends otherwise (its connection killed, on a client with
// DisableRetry, whose Receive gives up at once) is made again after a
// back-off: the watch ended there, and a waiter went on waiting after Close
// (TestClientClosedUnderWaiter, resp2-watch-killed-noretry).
func (c conn) watchClose(ctx context.Context) <-chan error {
	closed := make(chan error, 1)
	go func() {
		watch := "fencerueidis:closing:" + rand.Text()
		for failures := 1; ; failures++ {
			on, err := c.receive(ctx, watch, func(rueidis.PubSubMessage) {})
			if ctx.Err() != nil && !errors.Is(err, rueidis.ErrClosing) {
				c.unsubscribe(watch, on)
			}
			if errors.Is(err, rueidis.ErrClosing) || !pause.For(ctx, pause.Backoff(failures)) {
				closed <- err
				return
			}
		}
	}()
	return closed
}
