package resend

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestAfterClients: After is half the read timeout the client
// reads with, whenever the client sends a command again after a read
// timed out, and zero only when it does not. go-redis fills in the
// defaults (ReadTimeout 0: 5 s for a Client and a ClusterClient; MaxRetries
// 0: 3 for a Client, none for a cluster's node clients), but a Ring keeps its options as given and passes ReadTimeout to
// its shards, which read with 5 s for 0, while the Ring resends itself
// (Ring.process, its MaxRetries).
func TestAfterClients(t *testing.T) {
	addr := "127.0.0.1:1" // never dialled
	for _, tc := range []struct {
		name   string
		client func() redis.UniversalClient
		want   time.Duration
	}{
		{"client default", func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: addr}) }, 2500 * time.Millisecond},
		{"client no retries", func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		}, 0},
		{"client ReadTimeout -1", func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: -1})
		}, 0},
		{"client ReadTimeout -2", func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: -2})
		}, 0},
		{"failover default", func() redis.UniversalClient {
			return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{addr}})
		}, 2500 * time.Millisecond},
		{"failover no retries", func() redis.UniversalClient {
			return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{addr}, MaxRetries: -1})
		}, 0},
		// A ClusterClient resends on its own (MaxRedirects), but fence
		// sends its scripts to the slot master's node client, which
		// resends only with MaxRetries set (the cluster's default -1).
		{"cluster default", func() redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}})
		}, 0},
		{"cluster MaxRetries 2", func() redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, MaxRetries: 2})
		}, 2500 * time.Millisecond},
		{"cluster ReadTimeout -1", func() redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, ReadTimeout: -1})
		}, 0},
		{"cluster ReadTimeout -2", func() redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, ReadTimeout: -2})
		}, 0},
		{"cluster no retries", func() redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, MaxRetries: -1})
		}, 0},
		{"ring 400ms", func() redis.UniversalClient {
			return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}, ReadTimeout: 400 * time.Millisecond})
		}, 200 * time.Millisecond},
		{"ring default", func() redis.UniversalClient {
			return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}})
		}, 2500 * time.Millisecond},
		{"ring ReadTimeout -1", func() redis.UniversalClient {
			return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}, ReadTimeout: -1})
		}, 0},
		{"ring ReadTimeout -2", func() redis.UniversalClient {
			return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}, ReadTimeout: -2})
		}, 0},
		{"ring no retries", func() redis.UniversalClient {
			return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}, MaxRetries: -1})
		}, 0},
	} {
		c := tc.client()
		if got := After(c); got != tc.want {
			t.Errorf("%s: After %v, want %v", tc.name, got, tc.want)
		}
		_ = c.Close()
	}
}

// TestThroughCluster: a ClusterClient that commands are sent through
// resends on its own (MaxRedirects), whatever its MaxRetries; other clients
// are as After says.
func TestThroughCluster(t *testing.T) {
	addr := "127.0.0.1:1" // never dialled
	for _, tc := range []struct {
		name string
		o    redis.ClusterOptions
		want time.Duration
	}{
		{"default", redis.ClusterOptions{}, 2500 * time.Millisecond},
		{"MaxRetries -1", redis.ClusterOptions{MaxRetries: -1}, 2500 * time.Millisecond},
		{"no redirects", redis.ClusterOptions{MaxRedirects: -1}, 0},
		{"no redirects, MaxRetries 2", redis.ClusterOptions{MaxRedirects: -1, MaxRetries: 2}, 2500 * time.Millisecond},
		{"ReadTimeout -1", redis.ClusterOptions{ReadTimeout: -1}, 0},
		{"ReadTimeout -2", redis.ClusterOptions{ReadTimeout: -2}, 0},
	} {
		tc.o.Addrs = []string{addr}
		c := redis.NewClusterClient(&tc.o)
		if got := Through(c); got != tc.want {
			t.Errorf("%s: Through %v, want %v", tc.name, got, tc.want)
		}
		_ = c.Close()
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	if got, want := Through(c), After(c); got != want {
		t.Errorf("client: Through %v, want After's %v", got, want)
	}
	_ = c.Close()
}
