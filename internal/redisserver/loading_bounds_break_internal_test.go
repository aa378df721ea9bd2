package redisserver

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The loading wait of df0f3ec has bounds: a server that dies while it
// loads fails Restart at once (not after readyTimeout), and one that loads
// without answering (a load far slower than readyTimeout, the server too
// busy to tell its progress) fails after readyTimeout, not when the load
// would end.
func TestRestartLoadingBounds(t *testing.T) {
	defer func(d time.Duration) { readyTimeout = d }(readyTimeout)
	t.Run("dies-while-loading", func(t *testing.T) {
		s, err := Start("")
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		s.Kill()
		// An RDB that redis-server refuses to load: it exits.
		if err := os.WriteFile(filepath.Join(s.Dir, "dump.rdb"), []byte("REDIS0011garbage-that-is-not-an-rdb"), 0o600); err != nil {
			t.Fatal(err)
		}
		readyTimeout = 10 * time.Second
		began := time.Now()
		err = s.start()
		took := time.Since(began)
		t.Logf("start after a bad RDB: %.120v (after %v)", err, took.Round(time.Millisecond))
		if err == nil || took > readyTimeout/2 {
			t.Fatalf("start = %v after %v; want an error well before readyTimeout (%v)", err, took, readyTimeout)
		}
	})
	t.Run("load-slower-than-timeout", func(t *testing.T) {
		// 2 s per key, three keys: nothing answers until the load ends.
		s, err := Start("", "--key-load-delay", "2000000")
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
		defer c.Close()
		ctx := context.Background()
		for i := range 3 {
			if err := c.Set(ctx, "k"+strconv.Itoa(i), i, 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Save(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		readyTimeout = 500 * time.Millisecond
		began := time.Now()
		err = s.Restart()
		took := time.Since(began)
		t.Logf("Restart of a 6 s load: %.120v (after %v)", err, took.Round(time.Millisecond))
		if err == nil || took > 3*time.Second {
			t.Fatalf("Restart = %v after %v; want an error about readyTimeout (%v) in, not the load's 6 s", err, took, readyTimeout)
		}
	})
}
