package doctor_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/cmd/fence/internal/doctor"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A plain redis-server named as a cluster seed (--redis-cluster) or as a
// sentinel (--redis-sentinel) answers at once, refusing CLUSTER or
// SENTINEL. The doctor said "deployment unreachable" (ErrUnreachable:
// "did not answer"), sending the user to look for a network fault. It is
// the wrong flag for that server: an error matching fence.ErrInvalidOption
// that says what the server is and which flag fits.
func TestPlainServerGivenAsClusterOrSentinel(t *testing.T) {
	s := redistest.Start(t, durable...)
	for _, c := range []struct {
		name string
		cfg  doctor.Config
		want string
	}{
		{"cluster", doctor.Config{Cluster: &redis.ClusterOptions{Addrs: []string{s.Addr}}}, "--redis "},
		{"sentinel", doctor.Config{Sentinel: &redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: []string{s.Addr}}}, "--redis "},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := doctor.Run(ctx, c.cfg)
		cancel()
		t.Logf("%s: %v", c.name, err)
		if errors.Is(err, doctor.ErrUnreachable) || !errors.Is(err, fence.ErrInvalidOption) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Run = %v; want an error matching fence.ErrInvalidOption, not ErrUnreachable, naming %q", c.name, err, c.want)
		}
	}
}

// A Cluster with no seed address audited nothing and returned no findings
// and no error: "no findings" about a deployment it never read. A Sentinel
// with none said "deployment unreachable". Both are a bad Config.
func TestNoAddresses(t *testing.T) {
	for name, cfg := range map[string]doctor.Config{
		"cluster":  {Cluster: &redis.ClusterOptions{}},
		"sentinel": {Sentinel: &redis.FailoverOptions{MasterName: "mymaster"}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		fs, err := doctor.Run(ctx, cfg)
		cancel()
		if !errors.Is(err, fence.ErrInvalidOption) {
			t.Errorf("%s without addresses: Run = %v, %v; want an error matching fence.ErrInvalidOption", name, fs, err)
		}
	}
}
