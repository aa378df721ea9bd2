package payment_test

import (
	"context"
	"database/sql"
	"maps"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/payment"
)

// TestStaleFirstAnsweredAsItsResend: an approval sent with a key (A) takes
// the lock and pauses before its transaction; its lease runs out; the
// client, having heard nothing, sends it again with the same key (B), which
// takes the lock with a newer token and approves. A then wakes up: its
// fence is refused, a newer token having been accepted, and A answered
// guard.ErrStale, which the handler turns into 409 "approval overtaken by a
// newer one", though the newer approval was its own resend and B answered
// 200 with its token ("A after its resend B approved: token T_A, guard:
// stale token ...; want B's token T_B and nil", on PostgreSQL at READ
// COMMITTED and SERIALIZABLE, and SQLite). One key must get one answer,
// whichever of the two requests the client is still waiting on.
func TestStaleFirstAnsweredAsItsResend(t *testing.T) {
	e := setup(t)
	dbs := map[string]*sql.DB{"postgres-serializable": serializableDB(t)}
	maps.Copy(dbs, e.dbs)
	for name, db := range dbs {
		t.Run(name, func(t *testing.T) {
			reset(t, e, db)
			b := &payment.Service{Locker: e.locker, DB: db}
			var tokenB fence.Token
			var errB error
			a := &payment.Service{Locker: e.locker, DB: db, Pause: func(ctx context.Context, step payment.Step, _ int64, _ fence.Token) {
				if step != payment.Locked {
					return
				}
				if err := e.redis.Del(ctx, lockKey).Err(); err != nil { // A's lease runs out
					t.Error(err)
				}
				tokenB, errB = b.ApproveOnce(ctx, 1001, "alice", "k1")
			}}
			tokenA, errA := a.ApproveOnce(ctx(t), 1001, "alice", "k1")
			if errB != nil {
				t.Fatalf("B, the resend: %v", errB)
			}
			if errA != nil || tokenA != tokenB {
				t.Fatalf("A after its resend B approved: token %d, %v; want B's token %d and nil", tokenA, errA, tokenB)
			}
			wantCharges(t, db, 1001, 1)
		})
	}
}
