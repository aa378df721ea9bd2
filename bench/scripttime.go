package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// scriptClock returns how long, in µs, the server has spent running
// scripts since it started: EVALSHA and EVAL in INFO commandstats (a
// script's time includes the commands it calls). The uncontended workload
// reads it around each turn of a library's pairs.
type scriptClock func() (float64, error)

// newScriptClock reads the server at addr; close ends its connection.
// (SLOWLOG with no threshold would time each top-level command alone, but
// it also logs every command a script calls, inside the script's time:
// fence's scripts, with 8 calls a pair, then took twice their time.)
func newScriptClock(addr string) (clock scriptClock, close func()) {
	admin := redis.NewClient(&redis.Options{Addr: addr})
	return func() (float64, error) {
		stats, err := admin.Info(context.Background(), "commandstats").Result()
		if err != nil {
			return 0, err
		}
		var usec float64
		for _, line := range strings.Split(stats, "\r\n") {
			k, v, _ := strings.Cut(line, ":")
			if k != "cmdstat_evalsha" && k != "cmdstat_eval" {
				continue
			}
			for _, f := range strings.Split(v, ",") {
				if u, ok := strings.CutPrefix(f, "usec="); ok {
					x, err := strconv.ParseFloat(u, 64)
					if err != nil {
						return 0, fmt.Errorf("commandstats %q: %w", line, err)
					}
					usec += x
				}
			}
		}
		return usec, nil
	}, func() { _ = admin.Close() }
}

// scriptsOnly reports whether every command of an uncontended pair of the
// library named name is a script, so that its time in scripts is all its
// time in commands: not redsync's (SET NX PX), nor rueidislock's.
func scriptsOnly(name string) bool { return name != "redsync" && name != "rueidislock" }
