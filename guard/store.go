package guard

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/nilctx"
)

// Store orders a fenced request's token check with the handler's writes. Do
// runs fn only if token is greater than the last token accepted for
// resource, and no other Do on that resource checks its token until fn has
// returned and its writes are settled: a newer token cannot be checked
// between an older token's check and its writes. If the token is not
// greater, Do returns a *StaleError (matching ErrStale) and does not call
// fn. It returns fn's error as is (possibly joined with a cleanup error);
// other errors mean the store could not decide.
//
// A Store should also honour ctx's call id (CallFrom, see WithCall): record
// it with the token fn succeeded with, and answer the same token with the
// same call id with a *ReplayedError, without calling fn. A Store that
// ignores it answers such a resend as stale (409), as before call ids.
//
// MemoryStore and SQLStore are Stores. A store that can only compare and
// record a token, such as redisstore.Store, is an Acceptor: see Gate.
type Store interface {
	Do(ctx context.Context, resource string, token fence.Token, fn func(ctx context.Context) error) error
}

// Acceptor records a token if it is greater than the last one accepted for
// resource and returns nil; otherwise it returns a *StaleError (matching
// ErrStale) and records nothing. Other errors mean it could not decide. An
// Acceptor checks a token, and nothing more: it cannot order the check with
// writes made elsewhere afterwards. As a Store, it should honour ctx's call
// id, answering a second Accept of the accepted call with a *ReplayedError.
type Acceptor interface {
	Accept(ctx context.Context, resource string, token fence.Token) error
}

// MemoryStore keeps tokens in process memory and runs the calls of one
// resource one at a time: for a resource that lives in this process, and
// for tests. A token is spent when it is checked, even if fn then fails,
// since the store cannot undo fn's writes. The zero value is ready to use.
// It keeps an entry for every resource it was ever asked about, for as long
// as it lives (a forgotten last token would let a stale one in): give it a
// bounded set of names, not ResourceFromHeader's, which any client chooses.
type MemoryStore struct {
	mu        sync.Mutex
	resources map[string]*memoryResource
}

type memoryResource struct {
	turn chan struct{} // holds a value while a call runs; last and call are read and written only then
	last fence.Token
	call string // the call id (see WithCall) whose fn with last returned nil, or ""
}

// Do implements Store. It waits for the resource's earlier calls to return,
// or for ctx to be done; a call whose ctx is done when its turn comes
// returns the ctx's cause, and neither spends the token nor calls fn.
// A call with the last token and ctx's call id (see WithCall), if fn
// returned nil for that call, returns a *ReplayedError without calling fn;
// if fn failed, the resend is stale (the token was spent, fn's writes may
// have been made).
func (s *MemoryStore) Do(ctx context.Context, resource string, token fence.Token, fn func(ctx context.Context) error) error {
	if ctx == nil {
		return nilctx.Err("guard", "MemoryStore.Do")
	}
	if err := checkResource(resource); err != nil {
		return err
	}
	if err := checkToken(token); err != nil {
		return err
	}
	call := CallFrom(ctx)
	if err := checkCall(call); err != nil {
		return err
	}
	s.mu.Lock()
	r := s.resources[resource]
	if r == nil {
		if s.resources == nil {
			s.resources = make(map[string]*memoryResource)
		}
		r = &memoryResource{turn: make(chan struct{}, 1)}
		s.resources[resource] = r
	}
	s.mu.Unlock()
	select {
	case r.turn <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("guard: waiting for %q: %w", resource, context.Cause(ctx))
	}
	defer func() { <-r.turn }()
	if ctx.Err() != nil {
		// Both cases were ready, and select chose the turn at random: a
		// call whose ctx had ended would spend its token half the time.
		return fmt.Errorf("guard: waiting for %q: %w", resource, context.Cause(ctx))
	}
	if token == r.last && call != "" && call == r.call {
		return &ReplayedError{Resource: resource, Token: token, Call: call}
	}
	if token <= r.last {
		return &StaleError{Resource: resource, Token: token, Last: r.last}
	}
	r.last, r.call = token, ""
	err := fn(ctx)
	if err == nil {
		r.call = call
	}
	return err
}

// SQLStore keeps tokens in the fence_tokens table (see CreateTables) and
// runs fn inside the fenced transaction (see Tx): the token is recorded,
// and the resource's row locked, before fn runs; fn reaches the transaction
// with TxFrom and must make its writes through it. If fn returns an error
// the transaction rolls back and the token is not spent. When one of its
// statements fails, fn should answer with an error rather than write on:
// on SQLite some failures (an interrupted write, RAISE(ROLLBACK)) end the
// transaction, and Tx's commit hook then refuses the later statements
// (see Tx).
//
// fn must not open a transaction of its own on the database (Tx,
// DB.BeginTx) for the request's work: it is not part of the fenced
// transaction, and it may wait for it, which waits for fn, until ctx ends
// (Tx on the request's own resource, under its namespaced name, always
// does; on SQLite, any transaction does, until the busy timeout). Tx given
// fn's ctx and the store's DB refuses at once with ErrNestedTx; a
// transaction begun otherwise, or on another pool of the same database, is
// not seen. To fence another resource with the request, call Fence on
// TxFrom's transaction.
//
// A call id in ctx (WithCall; Middleware passes the request's Fence-Call)
// is recorded with the token in fence_tokens' call_id column: a resend of a
// committed call returns a *ReplayedError without running fn (see Fence).
// On a fence_tokens without that column (made before call ids, CreateTables
// not run since: see CreateTables) Do fences without the call id, as
// before call ids (a resend is stale), at the cost of one more BEGIN and
// ROLLBACK per call with an id, until the column is added.
type SQLStore struct{ DB *sql.DB }

// Do implements Store.
func (s SQLStore) Do(ctx context.Context, resource string, token fence.Token, fn func(ctx context.Context) error) error {
	if ctx == nil {
		return nilctx.Err("guard", "SQLStore.Do")
	}
	ran := false
	run := func(ctx context.Context) error {
		return Tx(ctx, s.DB, resource, token, func(tx *sql.Tx) error {
			ran = true
			return fn(context.WithValue(ctx, txKey{}, storeTx{db: s.DB, tx: tx}))
		})
	}
	err := run(ctx)
	var noColumn *noCallColumnError
	if !ran && CallFrom(ctx) != "" && errors.As(err, &noColumn) {
		// Fence failed before fn ran, and the transaction rolled back. (The
		// same error from fn, fencing on another database with ctx's call
		// id, came after fn's work: it is fn's error, not run again.)
		err = run(WithCall(ctx, ""))
	}
	return err
}

// txKey is the context key of the transaction SQLStore runs fn in, a
// storeTx.
type txKey struct{}

// storeTx is SQLStore's transaction and the database it is on, so that Tx
// can refuse to open another on that database in it (ErrNestedTx).
type storeTx struct {
	db *sql.DB
	tx *sql.Tx
}

// TxFrom returns the fenced transaction that SQLStore runs a handler in, and
// false if ctx carries none (a nil ctx, too). The handler makes its writes through it and
// leaves the commit or rollback to the store.
func TxFrom(ctx context.Context) (*sql.Tx, bool) {
	if ctx == nil {
		return nil, false
	}
	in, ok := ctx.Value(txKey{}).(storeTx)
	return in.tx, ok
}
