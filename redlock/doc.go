// Package redlock implements fence.Locker with the Redlock algorithm: a lock
// held on a majority of N independent Redis masters (Redis 7.0 or newer),
// each reached through the caller's own go-redis v9 client. The nodes are
// not replicas of one another and know nothing of each other.
//
// # Acquiring
//
// Acquire sends the acquire script to every node at once, each request
// bounded by Options.NodeTimeout (by default a twentieth of the lease time,
// between 100 ms and 1 s, so that a node that is down or hung costs little
// of it, while a healthy node on a loaded host or a slow network is not
// counted out; a node's first dial is made beforehand, untimed by it).
// The node timeout is a matter of availability, not safety: whatever it
// is, the validity check below refuses a lock granted too late to use.
// The lock is taken when a majority, N/2+1, granted it and the validity
// time left is positive. Acquire decides as soon as the outcome is known:
// once a majority has granted, without waiting for the other nodes, so its
// latency is the majority-th fastest node's rather than the slowest's (a
// node down or hung costs nothing then, not the node timeout); and once so
// many nodes refused (held by another owner, an error) that no majority is
// left, it fails at once. The validity is:
//
//	validity = TTL − elapsed − drift,  drift = TTL·1% + 2 ms
//
// where elapsed runs from before the first request was sent until the token
// was written back (below). Lease.Deadline is the start plus TTL − drift.
// A try that ran out of lease time before a majority granted it (a client
// paused past the node timeout, with the replies waiting in its sockets)
// fails with ErrValidity too.
//
// The replies that come after the decision are still read, up to the node
// timeout, whatever the caller does with its context. A late refusal or
// error changes nothing. A late grant belongs to the lease: it joins it
// (renewals then move the lock on that node too, and Release deletes it
// there); once the lease is released or has ended, or the try failed, it is
// given back as soon as it is read. Release, and the release of a failed
// try, also revoke the acquisition on every node whose grant had not come
// (below), so the node refuses it if it runs it afterwards: no lock is left
// behind for its lease time by a node that answered late.
// An acquisition that fails, for want of a majority or of validity, is
// released on every node it was sent to, even when the caller's context has
// ended: Acquire waits for the nodes that granted it (no longer than the
// caller's context: the releases go on without it), and revokes it in the
// background on the others (a node hung does not keep the caller waiting
// to try again); on a node that did not answer in time the release also leaves a
// revocation mark, so that the acquisition, if it is still sitting in a
// paused node's socket, refuses when it runs. A release that fails on such
// a node (still paused, its connections busy) is retried in the background,
// with back-off, within the lease time. Clients to the same address are
// refused by New (DuplicateNodeError): one server would count twice
// towards a majority. A client that reaches a server already listed under
// a name New cannot compare (a second DNS name, a proxy) is found at the
// first contact, by the server's run_id (INFO server), and its grants are
// never counted (AliasError); a node whose INFO fails then (down, or an
// ACL user without INFO) is not compared. A waiting Acquire (fence.Wait)
// tries again after a random pause around Options.RetryDelay until its
// budget or its context ends.
//
// The requests to the nodes run on goroutines that a Locker keeps while it
// is in use: each one, once its request is answered, waits up to 100 ms for
// another before it exits, so that a goroutine whose stack has grown to what
// a call through go-redis needs serves the next request instead of a new
// one growing its own again. A leak check run more than that after the last
// request finds none of them.
//
// Extend and the watchdog move the expiry on every node that still holds
// the lease and move the deadline only when a majority did so in time; the
// lease is lost when too few nodes still hold it for a majority, or when no
// renewal reached a majority before the deadline, and at once when the
// watchdog finds the clients of too many nodes closed for a majority
// (matching fence.ErrClosed too, on which fence.Lead stops at once). Each
// renewal carries the lease's deadline mapped to each node's clock (through
// that node's last reply, erring early, so the offsets between the clocks
// do not matter): a renewal that sits in a paused node's socket and runs
// after the deadline is refused there, rather than holding the lock for a
// lease nobody uses; a renewal whose lease ended while it was on its way is
// given back (in the background, which Close waits for: an Extend waits for
// that give-back only until its ctx ends, so nodes that hang as its replies
// come do not hold it a node timeout past its caller's deadline). The
// mapping errs early by how long the reply that read the node's clock took
// to be read: a refusal that comes before the deadline has passed locally
// only fails the renewal (the lock stays there until it runs out), it does
// not end the lease. One renewal runs at a time: the watchdog's and Extend
// take turns, so that no renewal decides on a deadline another one has
// moved. A lease that ends lost before its deadline has its Deadline moved
// back to the moment it ended. A renewal never moves a node's expiry
// earlier (PEXPIRE … GT): a short renewal held up on its way and overtaken
// by a longer one would otherwise cut the expiry below the Deadline the
// longer one gave, on every node it reached late. Release deletes the lock
// on every node where this lease owns it and succeeds when a majority did.
// Like Acquire, it is decided as soon as its outcome is known: once a
// majority has deleted the lock (nil), or once so many nodes found it gone
// that no majority can have deleted it (fence.ErrLeaseLost, exactly when
// every reply would have said so). If neither is known when the node
// timeout (capped by the lease time) ends and the lease's Deadline has
// passed meanwhile, the lease is over whatever the nodes answer: Release
// returns fence.ErrLeaseLost (reported as expired), not ErrNoQuorum, which
// would ask for a retry. The other nodes' releases go on in the background
// within the node timeout, and are retried, as above, on a node that does
// not answer. The lease ends (Err, Done, Context) before the first delete
// is sent, not when the replies come: another Acquire may take the lock as
// soon as a majority has deleted it.
//
// # Closing
//
// That background work (Release's deletes past the majority, the give-back
// of a grant read after its acquisition was decided, a failed try's
// releases and their retries) belongs to the Locker, not to the call that
// started it, and dies with the process. Call Locker.Close before the
// program exits: it releases the leases still held (as etcd's
// Session.Close revokes its lease) and waits, until its context ends, for
// that work to finish; it reports what it could not finish in a
// *CloseError naming the nodes. After Close, Acquire fails with ErrClosed
// (matching fence.ErrClosed and fence.ErrNotAcquired) and sends nothing. A program that exits
// without Close (or is killed) may leave a node it had not reached yet
// locked until the lease time runs out: a minority of the nodes, so no
// second holder can come of it (a majority is free), but the next owner
// needs a majority among the other nodes, and waits for one more slow node
// on every try until then.
//
// # Client retries
//
// go-redis sends a command again (Options.MaxRetries, 3 by default) when
// its connection failed before the reply was read, or its read timed out
// with time left in the context, though the node may have run the first
// copy. An acquisition run twice on a node finds the lock its try's there:
// that node is not counted as a grant (two clients of one server find it
// so too, and one server must not count twice), and the lock is given back
// if the try fails. A copy whose first run was delayed on its way (its read
// timed out, and the second copy granted) could run after the lease's
// Release and take the lock again on its node for its lease time: an
// acquisition whose request to some node took half that node's client's
// read timeout or longer (a ClusterClient resends through MaxRedirects
// too), or found the lock its try's already, is released (or, ended
// unreleased, given back; failed, revoked where it was held) on every node
// with the revocation mark, which refuses such a copy (a
// key per release, kept for a minute or the lease time, only for such an
// acquisition). A delete run twice still finds the lock gone, which
// Release counts as lost. Give the Locker clients made with MaxRetries: -1
// where that matters.
//
// # Keys
//
// A lock name N under the prefix P (default "redlock") uses, on each node:
//
//	P:{N}                 the lock: the try's 128-bit random owner id, with the lease's expiry
//	P:{N}:token           the last token this node issued or was told of; no expiry
//	P:{N}:revoked:OWNER   a revocation mark, for a minute
//
// # Tokens
//
// Each node's acquire script, in the same step that takes the lock, issues
//
//	max(last + 1, T, min(F, T + 2 s))
//
// for the name, T being the node's clock in microseconds and F the client's
// floor, its own clock a second ahead. The
// lease's token is the largest of the tokens issued by the nodes whose
// grants had come when Acquire decided (a majority), and before Acquire
// returns it is written back (raised to, never lowered) to those of them
// that answered a smaller one: a majority must hold it, or the acquisition
// fails. Every later majority shares at least one node with that majority,
// and that node issues a greater token, so tokens keep increasing across
// quorums even though no node sees every acquisition. A node whose grant
// came after the decision is not needed for this: its record may be
// smaller than the lease's token (no majority is made of the nodes outside
// that one) or greater (later tokens are then only greater). It is still
// told the lease's token, when its reply is read and before it joins the
// lease or is given back (not before Acquire returns), and by Release's
// revocation if that comes first: otherwise a later
// majority made of it and a node of the deciding majority that lost its
// record (restarted without persistence, the clocks set back) would issue
// a smaller token than the lease's, where the write-back to every grant
// keeps the order. The client's floor is there for speed: nodes that have seen
// the same acquisitions then answer the same token, and the write-back, a
// second round trip, is needed only for the nodes behind. It only ever
// raises a token, so a client whose clock is wrong makes tokens jump, never
// repeat; and it counts only up to 2 s past the node's own clock, so the
// jump is bounded. A client within a second of the nodes' clocks (ahead or
// behind) has F ≤ T + 2 s on every node: its floor counts in full
// everywhere and the nodes agree without the write-back. A client hours
// ahead makes tokens at most 2 s ahead of the nodes' clocks (plus one per
// acquisition), never hours: otherwise one such client would push every
// later token of the name, on every node, hours ahead, a resource refusing
// tokens too far ahead (guard's MaxAhead) would refuse every holder's until
// the clocks caught up, and the records would creep towards 2^53
// (ErrBadTokenRecord).
//
// The tokens are clock-floored: a lease's token is at least the clock, in
// microseconds, of every node of the majority that granted it, and at most
// 2 s ahead of them (plus one per acquisition). They qualify for
// guard/redisstore's Store.ClockTokens, whose default FloorMargin (2 s)
// covers that lead.
//
// This rests on two assumptions, stated plainly:
//
//   - A node that loses its data (restarted without persistence, or with
//     AOF not fsynced on every write) must stay down for at least the
//     longest lease time before it rejoins, or keep AOF with
//     appendfsync always. Otherwise it can grant a lock that a majority,
//     counting it, already granted to someone else: two holders. The
//     tokens still tell them apart, and the older holder's writes are
//     rejected by a resource that checks them.
//   - The clocks (of the nodes, or of the clients) agree to within the time
//     such a restart takes. The clock floor is what keeps a restarted, empty
//     node from issuing a token smaller than the ones it issued before; with
//     every clock set back by more than the downtime it could do so, and
//     only the write-back on the other nodes of a majority would save the
//     order.
//
// Redlock rests on timing: on bounded pauses of the client, the network and
// the nodes, and on clocks that advance at about the same rate. It does
// nothing for a client that pauses after Acquire returned, beyond telling
// it its deadline: the fencing token, checked by the resource, is what
// rejects a stale holder's writes.
package redlock
