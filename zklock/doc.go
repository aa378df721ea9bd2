// Package zklock is a fence.Locker on Apache ZooKeeper, through a
// github.com/go-zookeeper/zk connection that its user owns.
//
// # The recipe
//
// The lock called name is a directory under the Locker's root (a container
// node, which the servers delete once it is empty). Acquire creates an
// ephemeral sequential node in it, named after a fresh guid so that a create
// whose reply was lost with the connection can be found again, and holds the
// lock when its node is the lowest. That search (and the clean-up of an
// Acquire that gave up on its create) lists the directory after a sync, so
// that a follower behind the leader cannot answer "not found" for a create
// the leader committed; Acquire also deletes any other node of its own
// guid that it sees while it waits. A waiter watches only the node just
// before its own, so a release wakes one waiter, not all. It sets a data
// watch (GetW), not an exists-watch: on a node already gone, an
// exists-watch would wait for ever for its creation, on the server and in
// go-zookeeper. A waiter whose node goes while it waits (its session
// expired, an operator deleted it) gets an error matching
// fence.ErrLeaseLost, not the lock. A waiter that gives up (wait budget,
// ctx) deletes its node;
// it waits for that delete half a second at most (a server that hangs is
// given up by go-zookeeper only two thirds of a session timeout after its
// last reply), and the node is then deleted in the background. With a
// wait budget, every request of an Acquire lasts no longer than the budget,
// the read of the node it has just found first included, whatever the
// caller's ctx: one that the budget cut short returns ErrHeld if the lock
// was last seen held by another, else the request's error (not one that
// matches context.DeadlineExceeded, which would say the caller's ctx
// ended).
//
// # The token
//
// The token is the creation zxid of the holder's node (Stat.Czxid): 64 bits,
// the leader's epoch in the high 32 and a counter in the low 32, so it
// increases across leader elections. Nodes in one directory are numbered in
// the order of their zxids, and a node holds the lock only after every node
// before it is gone: each holder's token is greater than every earlier
// holder's. The zxids are as durable as the ensemble's transaction log: an
// ensemble that loses its data (rebuilt empty) starts them again, and one
// restored from a backup takes them back to the backup's (the next token
// was 0xe after 0x26 had been issued since the backup: a standalone server
// stays in epoch 0, and an ensemble goes on from the backup's epoch).
// ZooKeeper has no way to raise them, as etcdutl's --bump-revision raises
// etcd's revisions, so after such a restore the new holders' tokens are
// below those issued since the backup until the zxids pass them again,
// and a resource that recorded one refuses the new holders meanwhile. The
// rule, then: stop every client that may hold a lease or a token from
// before the restore (one paused that writes later carries a token above
// the new holders', which a cleared record accepts), restore, clear each
// resource's token record (with guard, its row in fence_tokens), and only
// then start the clients again.
//
// # The lease is the session
//
// A lease is held while its node exists, and the node lives as long as the
// session that made it: ZooKeeper deletes it when the session expires, a
// session timeout after a server last heard from the client. The lease ends
// (Done is closed, Err matches fence.ErrLeaseLost) when
//   - the node is deleted, or the session expires or the connection is
//     closed: the node's watch says so (go-zookeeper reports an expiry only
//     once it reaches a server again);
//   - its Deadline passes: the Locker checks the node every third of the
//     session timeout, and Deadline is a session timeout after the last
//     such request that ZooKeeper answered (less 1% and 2 ms for the
//     clocks' rates), or, with WithSessionTimeouts, after the dialling
//     of the connection the session was last re-established on, if later.
//     That is how long ZooKeeper keeps the session at least, whatever
//     happened since;
//   - for a lease taken with fence.TTL, its lease time ran out: fence.TTL is
//     enforced here, by the holder deleting its own node at the deadline
//     unless Extend moved it. A holder paused past that keeps the node
//     until its session expires, and its Deadline (never later than the
//     lease time nor than the session's) tells it so when it resumes.
//
// Without fence.TTL there is nothing to renew: the client library's pings
// keep the session, and the Locker's checks move Deadline. The "watchdog
// TTL" of such a lease is the session timeout.
//
// An Acquire whose node came first in line, but whose read of it (the
// token) was answered after the deadline its lease would have (a paused
// server), gives no lease, which would be over before anyone used it: it
// deletes its node and queues again with a new one, after a back-off
// (10 ms doubling to 1 s, jittered), within its wait budget, or fails with
// fence.ErrNotAcquired saying the reply came too late.
//
// # Connection loss
//
// A connection loss is not an expiry: go-zookeeper reconnects (to another
// server of the ensemble, say) and the session, its node and the lease go
// on if it does so within the session timeout. An Acquire whose request
// was cut off with the connection sends it again after the reconnection
// (a create only after looking for its node), within its ctx and wait
// budget; it fails on a session expiry or when the user closes the
// connection. Meanwhile the lease still
// looks held (Err is nil), but its Deadline stops moving: a holder must
// check Deadline (or pass its token to a resource that checks it) before
// acting. If no server answers before the Deadline, the lease ends with
// ErrLeaseLost although the session may still be alive; the Locker then
// deletes the node once it can reach a server again, so that a session
// that survived does not keep the lock nobody uses.
//
// # The connection and its events
//
// The Locker does not read the connection's event channel (zk.Connect's
// second result): that channel is the user's, and a second reader would
// steal events from them. It learns of expiry and closing from the watches
// it sets on its own nodes, which go-zookeeper ends with an event carrying
// zk.ErrSessionExpired or zk.ErrClosing.
//
// # The negotiated session timeout
//
// The servers clamp the session timeout a client asks for to their
// [minSessionTimeout, maxSessionTimeout] (2 and 20 ticks by default), and
// go-zookeeper does not expose the one they grant: it only logs it, in
// its "authenticated" line, each time the connection (re)establishes its
// session. A deadline counted from a timeout that the servers lowered
// would outlast the session: the holder would see its lease held after
// ZooKeeper expired the session and gave the lock to the next. New takes
// the timeout given to zk.Connect, and leases count their deadlines, and
// the Locker its checks, from the lower of it and the granted one;
// NegotiatedTimeout reports the granted one, and WithLogger's logger gets
// a warning when it is lower than the one asked. A timeout the servers
// raised (asked below their minimum) changes nothing: deadlines stay
// counted from the one asked, which is earlier. The Locker learns the
// granted one in one of two ways.
//
// The exact way: a SessionTimeouts given to zk.Connect as its logger,
// and to New with WithSessionTimeouts:
//
//	st := zklock.NewSessionTimeouts(nil) // forwards to zk.DefaultLogger, or the zk.Logger given
//	conn, events, err := zk.Connect(servers, 10*time.Second, zk.WithLogger(st))
//	locker, err := zklock.New(conn, 10*time.Second, zklock.WithSessionTimeouts(st))
//
// It records the timeout of every "authenticated" line, which go-zookeeper
// logs before it sends or receives anything else on that connection, so
// every reply the Locker gets was sent on a connection whose grant is
// recorded. A session keeps the lowest timeout it was granted, and only a
// new session starts over: a server that the session moves to, or one
// restarted with other bounds, revalidates it with its own bounds, and
// go-zookeeper asks each time for the timeout last granted, so a raise
// comes only from a server's minSessionTimeout, and is not trusted. Each
// lease counts its deadline from that timeout as it is when the deadline
// is read: a reconnection that the servers grant less lowers the leases'
// Deadlines at once, to that timeout after the later of their last
// contact and the dialling of the new connection (the server heard the
// connect request, sent after that, and kept the session), and their
// checks then come a third of it apart. A lease whose session the
// connection no longer has ends then (ErrLeaseLost). No probe runs. If the SessionTimeouts has
// recorded nothing once the connection answered a read (the first
// Acquire sends one: it may run before the connection has its session),
// because it was not given to zk.Connect, a later zk.WithLogger or
// conn.SetLogger replaced it, or zk.WithLogInfo(false) silenced the line,
// Acquire fails at once with fence.ErrInvalidOption, naming the fix,
// rather than count a deadline from a timeout the servers did not
// confirm; it fails so too if the lock's node is not of the session the
// SessionTimeouts last recorded (one shared by two connections). Give
// each connection its own, and replace it with no other logger later: a
// replaced one, once it has recorded a grant, cannot tell that it no
// longer sees them. One grant it cannot see: a server restarted with a
// lower maxSessionTimeout renews the session with the lower timeout when
// it reads the connect request, and if the reply is then lost (the
// connection breaks), nothing is logged; the session expires by the
// lower timeout while the leases count from the higher (two holders), and
// the client cannot know what was granted. So lower a server's
// maxSessionTimeout below the timeout that sessions holding leases were
// granted only with those leases released, or their clients stopped.
//
// The default, without WithSessionTimeouts: the first Acquire probes. It
// opens a short session of its own to the server the connection is on
// (conn.Server()), asking for the same timeout, through net.DialTimeout
// or the dialer of WithDialer, reads the timeout granted from its
// "authenticated" line, and closes it. One probe serves the Locker for
// its life; concurrent first Acquires wait for the same probe. The probe
// waits for the connection to have a session, and lasts no longer than
// the ctx of the Acquire that started it (its own session no longer than
// the session timeout, 5 s at least); an Acquire waits for it no longer
// than its ctx and wait budget, and a probe that outlasts a wait budget
// goes on, for the next Acquire to wait for rather than start over. If it
// does not succeed, the Acquire fails, and the next one probes again; no
// lease is counted from a timeout the servers did not confirm. Its
// limits, which the exact way does not have: it asks the server the
// connection is on when the first Acquire runs, once for the Locker's
// life, and a session that the servers expire by a lower timeout than
// that one outlives its leases' Deadlines (two holders): one created on a
// server with a lower bound than the one probed, or moved to one
// (configure an ensemble's servers alike), or reconnected to a server
// restarted with a lower bound (after lowering maxSessionTimeout, make
// new Lockers, on new connections); its connection counts against the
// server's maxClientCnxns, so a client at that limit gets no lease; one
// that its Acquire's ctx ended starts over at the next, so Acquires whose
// ctx is shorter than a probe get none either; on servers that enforce
// authentication (enforce.auth.enabled) its session, which cannot
// authenticate, is granted but not closed, and expires a session timeout
// later, as does one whose grant was in flight when its ctx ended; and it
// cannot use the connection's own dialer or host provider (zk.WithDialer,
// zk.WithHostProvider), so a connection that needs a dialer of its own
// (TLS, a proxy) needs WithDialer too.
//
// # Calls and contexts
//
// go-zookeeper's calls take no context. The Locker runs each in a goroutine
// and stops waiting for it when ctx is done; a create given up on that
// succeeds later is deleted when its reply comes. Every such call ends by
// the time the connection is closed.
//
// A Release that fails leaves its node to a delete in the background. A
// Release retried later that finds the node gone returns nil (its own
// delete, or the background one, may have removed it), unless the failed
// call sent nothing and the background delete found no node: then the
// node was gone before, and it returns an error matching
// fence.ErrLeaseLost.
//
// go-zookeeper v1.0.4 reads and writes its last seen zxid from two
// goroutines when it reconnects with watches set while replies arrive (a
// race inherited from samuel/go-zookeeper, where it is issue 260): the
// race detector may report it in a program that reconnects under load. The
// Locker sends nothing while disconnected, so as not to provoke it:
// neither its own checks of a lease's node and clean-up deletes, nor the
// requests of an Acquire, Extend or Release, which wait for the session
// within their ctx (go-zookeeper would queue them and send them the moment
// it reconnects, beside that re-setting). What is left is go-zookeeper's
// own: the instant between its reporting the session and re-setting the
// watches, and the one between a connection's end and its reporting it
// lost; a zk.Logger that blocks (a full stderr pipe) stretches both,
// since go-zookeeper logs inside them. Requests the program sends on the
// connection itself while disconnected may provoke it too.
package zklock
