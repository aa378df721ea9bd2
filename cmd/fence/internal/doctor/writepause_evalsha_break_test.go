package doctor_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/doctor"
	"github.com/redis/go-redis/v9"
)

// TestWritePauseUserWithoutEval: TestWritePause as an ACL user denied EVAL
// (scripts loaded by an administrator, sent by EVALSHA). The EVAL probe is
// refused at once, so the probe script is not cached, and the EVALSHA of
// a script the server does not know, whose flags it cannot read, is held
// back for the whole pause: the audit must still end within its deadline
// and report EVAL denied, not the deployment unreachable.
func TestWritePauseUserWithoutEval(t *testing.T) {
	primary, _ := cleanPair(t)
	admin := primary.Client(t)
	if err := admin.Do(context.Background(), "ACL", "SETUSER", "noeval", "on", ">pw", "~*", "&*", "+@all", "-eval").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(context.Background(), "SCRIPT", "FLUSH").Err(); err != nil { // as a promoted replica's
		t.Fatal(err)
	}
	if err := admin.Do(context.Background(), "CLIENT", "PAUSE", "60000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Do(context.Background(), "CLIENT", "UNPAUSE").Err() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	fs, err := doctor.Run(ctx, doctor.Config{Standalone: &redis.Options{Addr: primary.Addr, Username: "noeval", Password: "pw"}})
	if err != nil {
		t.Fatalf("doctor.Run as a user without EVAL on a primary pausing writes: %v (after %v)", err, time.Since(start).Round(time.Millisecond))
	}
	t.Logf("findings:\n%s", dump(fs))
	has(t, fs, "command-denied", doctor.Critical, primary.Addr)
}
