package doctor_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/doctor"
)

// TestWritePause: the doctor audits a primary that pauses writes (CLIENT
// PAUSE WRITE: an operator's switchover or maintenance), which still
// answers reads and fence's Status. Its probes of EVAL and of INFO inside
// a script declared no flags, and Redis held them back for the whole
// pause as possible writes: the audit ran to its 5 s deadline and said
// "deployment unreachable: ...: ACL: context deadline exceeded".
func TestWritePause(t *testing.T) {
	primary, _ := cleanPair(t)
	admin := primary.Client(t)
	if err := admin.Do(context.Background(), "SCRIPT", "FLUSH").Err(); err != nil { // as a promoted replica's
		t.Fatal(err)
	}
	if err := admin.Do(context.Background(), "CLIENT", "PAUSE", "60000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Do(context.Background(), "CLIENT", "UNPAUSE").Err() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	fs, err := doctor.Run(ctx, standalone(primary))
	if err != nil {
		t.Fatalf("doctor.Run on a primary pausing writes: %v", err)
	}
	if len(fs) != 0 {
		t.Fatalf("findings on a clean deployment pausing writes:\n%s", dump(fs))
	}
}
