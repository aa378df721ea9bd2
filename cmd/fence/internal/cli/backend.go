package cli

import (
	"errors"
	"strings"

	"github.com/fencekit/fence"
	"github.com/spf13/cobra"
)

// backend is a lock service other than the default, Redis, that exec can
// take its lock from. Each lives in a file of its own (backend_*.go) and is
// listed in otherBackends.
type backend interface {
	// register adds the backend's flags to cmd.
	register(cmd *cobra.Command)
	// flag names the flag that chooses the backend, for error messages.
	flag() string
	// chosen reports whether that flag, or its environment variable, was
	// given.
	chosen() bool
	// locker connects; the returned func closes the connection.
	locker(cmd *cobra.Command) (fence.Locker, func(), error)
}

// otherBackends returns a fresh set of the backends besides Redis.
func otherBackends() []backend {
	return []backend{&redlockBackend{}, &zookeeperBackend{}, &etcdBackend{}}
}

// lockerFlags are the flags of commands that take a lock: Redis's, and
// those of every other backend.
type lockerFlags struct {
	redis  redisFlags
	others []backend
}

func (f *lockerFlags) register(cmd *cobra.Command) {
	f.redis.register(cmd)
	f.others = otherBackends()
	for _, b := range f.others {
		b.register(cmd)
	}
}

// locker connects to the chosen backend, Redis unless another backend's
// flag was given; giving two, or another backend's flag together with a
// Redis URL flag on the command line, is a usage error.
func (f *lockerFlags) locker(cmd *cobra.Command) (fence.Locker, func(), error) {
	if err := emptyBackendFlag(cmd, f.others); err != nil {
		return nil, nil, exitWith(ExitUsage, err)
	}
	var names []string
	var chosen []backend
	for _, b := range f.others {
		if b.chosen() {
			chosen = append(chosen, b)
			names = append(names, "--"+b.flag())
		}
	}
	if len(chosen) > 0 {
		for _, r := range []string{"redis", "redis-sentinel", "redis-cluster"} {
			if cmd.Flags().Changed(r) {
				names = append(names, "--"+r)
			}
		}
	}
	switch {
	case len(chosen) == 0:
		return f.redis.locker(cmd)
	case len(names) == 1:
		if _, ok := chosen[0].(*redlockBackend); !ok {
			if err := tlsFlagsWithout(cmd, "--"+chosen[0].flag()); err != nil {
				return nil, nil, exitWith(ExitUsage, err)
			}
		}
		return chosen[0].locker(cmd)
	default:
		return nil, nil, exitWith(ExitUsage, errors.New("give one lock service, not "+strings.Join(names, " and ")))
	}
}

// emptyBackendFlag returns an error naming the first of backends' flags
// given on the command line with nothing in it (--redlock "$URLS" with URLS
// unset): left alone, it would read as not given and fence would use the
// default Redis, another lock service than the one meant.
func emptyBackendFlag(cmd *cobra.Command, backends []backend) error {
	for _, b := range backends {
		f := cmd.Flags().Lookup(b.flag())
		if f != nil && f.Changed && strings.TrimSpace(f.Value.String()) == "" {
			return errors.New("--" + b.flag() + " was given with no value: name the servers, or leave the flag out")
		}
	}
	return nil
}
