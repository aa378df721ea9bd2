//go:build !race

package redislock_test

// raceAllocs is zero without the race detector; see alloc_race_test.go.
const raceAllocs = 0
