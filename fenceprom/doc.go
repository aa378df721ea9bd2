// Package fenceprom exports what fence's lockers and guards do as
// Prometheus metrics: a fence.Observer backed by client_golang collectors.
//
//	obs, err := fenceprom.New(prometheus.DefaultRegisterer, nil)
//	locker, err := redislock.New(client, &redislock.Options{Observer: obs})
//	mw := guard.Middleware(store, guard.HTTPOptions{Resource: …, Observer: obs})
//
// The metrics, whose label values are all bounded (lock and resource names
// are never labels):
//
//	fence_acquisitions_total{backend,result}         counter
//	fence_wait_seconds{backend,result}               histogram: Acquire's duration
//	fence_hold_seconds{backend,cause}                histogram: from grant to end
//	fence_leases_lost_total{backend,cause}           counter: ends other than "released"
//	fence_replica_sync_refusals_total{backend,op}    counter
//	fence_guard_decisions_total{decision,class}      counter
//
// result is one of fence.AcquireResult's values, cause one of
// fence.LeaseCause's, op "acquire" or "renew", decision "accept" or
// "reject", and class what Options.Classify makes of the resource name
// ("" without it): at most Options.MaxClasses distinct values (100 by
// default), "other" past them, since resources often come from requests.
//
// So that an alert on a rate or increase fires on the first event too, a
// backend's fence_leases_lost_total, fence_acquisitions_total and
// fence_replica_sync_refusals_total series (every cause, every result,
// both ops) are created at 0 on its first event, and a class's two
// fence_guard_decisions_total series on its first decision. A refusal's
// acked and required counts are therefore not labels (they are known only
// at the refusal): the locker's Logger logs them.
//
// It lives in a module of its own so that fence's own go.mod does not
// require client_golang.
package fenceprom
