package payment_test

import (
	"context"
	"errors"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/payment"
)

// TestStaleWorkerAfterNewerRolledBack: A takes the lock and pauses before
// its transaction; its lease runs out; B takes the lock, fences payment
// 1001 with its newer token and reads PENDING, and then its caller gives up
// (B's transaction rolls back, its fence with it); A wakes up and approves
// with its older token. The fence holds committed tokens only, so A's
// passes: a rolled-back attempt wrote nothing and retires no token, as the
// DESIGN's rule says (accept t iff no greater token was accepted) and
// guard's doc states. What the rule protects holds: the payment is approved
// once, and B's retry, with a new lease, finds it approved (no second
// charge) and is itself accepted. Retiring B's token would need the fence
// committed on its own before the work (one more commit per write) and a
// token that wrote nothing counted as accepted: decided against
// (2026-12-03): this test keeps the decided behaviour.
func TestStaleWorkerAfterNewerRolledBack(t *testing.T) {
	e := setup(t)
	for name, db := range e.dbs {
		t.Run(name, func(t *testing.T) {
			reset(t, e, db)
			ctxB, giveUp := context.WithCancel(ctx(t))
			defer giveUp()
			b := &payment.Service{Locker: e.locker, DB: db, Pause: func(_ context.Context, step payment.Step, _ int64, _ fence.Token) {
				if step == payment.Read {
					giveUp() // B's caller goes away after B's fence and read
				}
			}}
			var errB error
			a := &payment.Service{Locker: e.locker, DB: db, Pause: func(ctx context.Context, step payment.Step, _ int64, _ fence.Token) {
				if step != payment.Locked {
					return
				}
				if err := e.redis.Del(ctx, lockKey).Err(); err != nil { // A's lease runs out
					t.Error(err)
				}
				_, errB = b.Approve(ctxB, 1001, "B")
			}}
			_, errA := a.Approve(ctx(t), 1001, "A")
			if !errors.Is(errB, context.Canceled) {
				t.Fatalf("B: %v, want its caller's cancellation", errB)
			}
			if errA != nil {
				t.Fatalf("A, after B's attempt rolled back: %v, want its approval accepted (nothing newer was written)", errA)
			}
			p, err := payment.Get(ctx(t), db, 1001)
			if err != nil {
				t.Fatal(err)
			}
			if p.Status != "APPROVED" || p.ApprovedBy != "A" {
				t.Fatalf("payment %+v, want approved by A", p)
			}
			// B retries with a new lease: the payment is approved already.
			b.Pause = nil
			if _, err := b.Approve(ctx(t), 1001, "B"); !errors.Is(err, payment.ErrAlreadyApproved) {
				t.Fatalf("B's retry: %v, want payment.ErrAlreadyApproved", err)
			}
			if p, err = payment.Get(ctx(t), db, 1001); err != nil || p.ApprovedBy != "A" {
				t.Fatalf("payment %+v (%v) after B's retry, want still approved by A", p, err)
			}
		})
	}
}
