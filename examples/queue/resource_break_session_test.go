package queue_test

import (
	"testing"

	"github.com/fencekit/fence/examples/queue"
)

// TestResourcesOfTwoStreamsDistinct: the guard resource of a message is
// Resource(stream, key). Before message ids a key was a stream entry id,
// which holds no ':', so two streams' resources never met; a message id
// may hold ':' (the docs' own "payment:1001:approve"), and a stream's
// name too ("orders", "orders:eu"). Then the message "eu:42" of "orders"
// and the message "42" of "orders:eu" fence on one resource with the
// tokens of two unrelated locks (LockName of each stream): the leader with
// the older token is refused as stale (guard.ErrStale), takes itself for
// deposed and gives its lease up, though nobody replaced it.
func TestResourcesOfTwoStreamsDistinct(t *testing.T) {
	t.Skip("design question: Resource(stream, key) is ambiguous once keys may hold ':' (queue:orders:eu:42 is both (orders, eu:42) and (orders:eu, 42)), " +
		"so two streams' leaders, whose tokens come from unrelated locks, can fence on one guard resource. " +
		"Fix I would choose: keep Resource as it is for entry-id keys (the guard's records of messages applied before the upgrade stay in force) " +
		"and give message-id keys a resource that cannot meet another stream's, e.g. \"queue:\" + stream + \":id:\" + hex or length-prefixed id, " +
		"or refuse ':' in ProduceID ids and in stream names; it changes what a message fences on, so it is the queue's owner's call")
	for _, c := range []struct{ s1, k1, s2, k2 string }{
		{"orders", "eu:42", "orders:eu", "42"},
		{"orders", "payment:1001:approve", "orders:payment", "1001:approve"},
	} {
		if a, b := queue.Resource(c.s1, c.k1), queue.Resource(c.s2, c.k2); a == b {
			t.Errorf("message %q of stream %q and message %q of stream %q fence on one resource, %q", c.k1, c.s1, c.k2, c.s2, a)
		}
	}
}
