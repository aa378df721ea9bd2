//go:build race

package redislock_test

// raceAllocs is what the race detector adds to the allocation ceilings: in
// a race build sync.Pool drops a share of what is put back at random (and
// go-redis pools its readers and writers), so the counts go up by one or two.
const raceAllocs = 3
