package guard

import (
	"context"
	"database/sql"
	_ "embed"
	"fmt"
	"strconv"
	"sync"

	"github.com/fencekit/fence"
	"github.com/redis/go-redis/v9"
)

// Store keeps the last accepted token per resource. Accept records token if
// it is greater than the last one and returns nil; otherwise it returns a
// *StaleError (matching ErrStale) and records nothing. Other errors mean the
// store could not decide.
type Store interface {
	Accept(ctx context.Context, resource string, token fence.Token) error
}

// MemoryStore keeps tokens in process memory: for one process, and for
// tests. The zero value is ready to use.
type MemoryStore struct {
	mu   sync.Mutex
	last map[string]fence.Token
}

// Accept implements Store.
func (s *MemoryStore) Accept(_ context.Context, resource string, token fence.Token) error {
	if err := checkResource(resource); err != nil {
		return err
	}
	if err := checkToken(token); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if last := s.last[resource]; token <= last {
		return &StaleError{Resource: resource, Token: token, Last: last}
	}
	if s.last == nil {
		s.last = make(map[string]fence.Token)
	}
	s.last[resource] = token
	return nil
}

// SQLStore keeps tokens in the fence_tokens table (see CreateTables). Each
// Accept commits on its own.
type SQLStore struct{ DB *sql.DB }

// Accept implements Store.
func (s SQLStore) Accept(ctx context.Context, resource string, token fence.Token) error {
	return Fence(ctx, s.DB, resource, token)
}

//go:embed accept.lua
var acceptSrc string
var acceptScript = redis.NewScript(acceptSrc)

// RedisStore keeps tokens in Redis, one key per resource under Prefix
// (default "fence:guard"), compared and set by one script.
type RedisStore struct {
	Client redis.Scripter
	Prefix string
}

// Accept implements Store.
func (s RedisStore) Accept(ctx context.Context, resource string, token fence.Token) error {
	if err := checkResource(resource); err != nil {
		return err
	}
	if err := checkToken(token); err != nil {
		return err
	}
	prefix := s.Prefix
	if prefix == "" {
		prefix = "fence:guard"
	}
	key := prefix + ":{" + resource + "}"
	last, err := acceptScript.Run(ctx, s.Client, []string{key}, strconv.FormatInt(int64(token), 10)).Text()
	if err != nil {
		return fmt.Errorf("guard: accept %q: %w", resource, err)
	}
	if last == "" {
		return nil
	}
	n, err := strconv.ParseInt(last, 10, 64)
	if err != nil {
		return fmt.Errorf("guard: accept %q: bad stored token %q", resource, last)
	}
	return &StaleError{Resource: resource, Token: token, Last: fence.Token(n)}
}
