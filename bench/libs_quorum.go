package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/redlock"
	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// redlockLibs builds fence's redlock and redsync's Redlock over the
// independent masters at addrs, each library with its own client per node.
func redlockLibs(addrs []string) ([]*lib, error) {
	n := len(addrs)
	newClients := func() ([]*redis.Client, func()) {
		cs := make([]*redis.Client, n)
		for i, a := range addrs {
			cs[i] = redis.NewClient(&redis.Options{Addr: a, PoolSize: 128})
		}
		return cs, func() {
			for _, c := range cs {
				_ = c.Close()
			}
		}
	}

	fcs, fclose := newClients()
	ucs := make([]redis.UniversalClient, n)
	for i, c := range fcs {
		ucs[i] = c
	}
	fl, err := redlock.New(ucs, nil) // its defaults: 50 ms per node, 100 ms mean retry delay
	if err != nil {
		fclose()
		return nil, err
	}
	fenceRL := &lib{name: fmt.Sprintf("fence redlock (%d masters)", n), close: fclose,
		acquire: func(ctx context.Context, key string) (func(), error) {
			lease, err := fl.Acquire(ctx, key, fence.Wait(time.Minute), fence.TTL(leaseTTL))
			if err != nil {
				return nil, err
			}
			return func() { _ = lease.Release(ctx) }, nil
		}}

	rcs, rclose := newClients()
	pools := make([]redsyncredis.Pool, n)
	for i, c := range rcs {
		pools[i] = goredis.NewPool(c)
	}
	rs := redsync.New(pools...)
	redsyncRL := &lib{name: fmt.Sprintf("redsync (%d masters)", n), close: rclose,
		acquire: redsyncAcquire(rs)}
	return []*lib{fenceRL, redsyncRL}, nil
}

// etcdClient returns a client of endpoints, quiet.
func etcdClient(endpoints []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

// etcdLibs builds fence's etcdlock and etcd's concurrency.Mutex on the
// server at endpoints, each library with its own client.
//
// concurrency.Mutex is measured twice: with a session (an etcd lease kept
// alive in the background) per goroutine, reused from lock to lock, its
// usual use; and with a session per lock, which gives each lock its own etcd
// lease as etcdlock does (so that losing it loses that lock only).
func etcdLibs(endpoints []string) ([]*lib, error) {
	var out []*lib
	closeAll := func() {
		for _, l := range out {
			l.close()
		}
	}

	fc, err := etcdClient(endpoints)
	if err != nil {
		return nil, err
	}
	el, err := etcdlock.New(fc, nil)
	if err != nil {
		_ = fc.Close()
		return nil, err
	}
	out = append(out, &lib{name: "fence etcdlock", close: func() { _ = fc.Close() },
		acquire: func(ctx context.Context, key string) (func(), error) {
			lease, err := el.Acquire(ctx, key, fence.Wait(time.Minute), fence.TTL(leaseTTL))
			if err != nil {
				return nil, err
			}
			return func() { _ = lease.Release(ctx) }, nil
		}})

	mc, err := etcdClient(endpoints)
	if err != nil {
		closeAll()
		return nil, err
	}
	// Sessions not in use: a goroutine takes one (or makes one) for a lock
	// and gives it back on release, so that concurrent lockers never share
	// one (a Mutex's key is its session's lease: two lockers on one
	// session would be one holder).
	var mu sync.Mutex
	var free, made []*concurrency.Session
	ttl := concurrency.WithTTL(int(leaseTTL / time.Second))
	out = append(out, &lib{name: "concurrency.Mutex (session per goroutine)",
		close: func() {
			for _, s := range made {
				_ = s.Close()
			}
			_ = mc.Close()
		},
		acquire: func(ctx context.Context, key string) (func(), error) {
			mu.Lock()
			var s *concurrency.Session
			if len(free) > 0 {
				s, free = free[len(free)-1], free[:len(free)-1]
			}
			mu.Unlock()
			if s == nil {
				var err error
				if s, err = concurrency.NewSession(mc, ttl); err != nil {
					return nil, err
				}
				mu.Lock()
				made = append(made, s)
				mu.Unlock()
			}
			put := func() { mu.Lock(); free = append(free, s); mu.Unlock() }
			m := concurrency.NewMutex(s, "bench/"+key)
			if err := m.Lock(ctx); err != nil {
				put()
				return nil, err
			}
			return func() { _ = m.Unlock(ctx); put() }, nil
		}})

	pc, err := etcdClient(endpoints)
	if err != nil {
		closeAll()
		return nil, err
	}
	out = append(out, &lib{name: "concurrency.Mutex (session per lock)", close: func() { _ = pc.Close() },
		acquire: func(ctx context.Context, key string) (func(), error) {
			s, err := concurrency.NewSession(pc, ttl)
			if err != nil {
				return nil, err
			}
			m := concurrency.NewMutex(s, "bench-per-lock/"+key)
			if err := m.Lock(ctx); err != nil {
				_ = s.Close()
				return nil, err
			}
			return func() { _ = m.Unlock(ctx); _ = s.Close() }, nil
		}})
	return out, nil
}
