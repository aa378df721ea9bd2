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
func otherBackends() []backend { return []backend{&redlockBackend{}, &zookeeperBackend{}} }

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
// flag was given; giving two is a usage error.
func (f *lockerFlags) locker(cmd *cobra.Command) (fence.Locker, func(), error) {
	var chosen []backend
	for _, b := range f.others {
		if b.chosen() {
			chosen = append(chosen, b)
		}
	}
	switch len(chosen) {
	case 0:
		return f.redis.locker(cmd)
	case 1:
		return chosen[0].locker(cmd)
	default:
		var names []string
		for _, b := range chosen {
			names = append(names, "--"+b.flag())
		}
		return nil, nil, exitWith(ExitUsage, errors.New("give one lock service, not "+strings.Join(names, " and ")))
	}
}
