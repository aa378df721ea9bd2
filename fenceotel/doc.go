// Package fenceotel exports what fence's lockers and guards do as
// OpenTelemetry metrics: a fence.Observer that records into instruments of
// an otel metric.Meter.
//
//	obs, err := fenceotel.New(otel.GetMeterProvider().Meter("github.com/fencekit/fence"), nil)
//	locker, err := redislock.New(client, &redislock.Options{Observer: obs})
//
// The instruments match the Prometheus adapter's (fenceprom), with
// OpenTelemetry's names and units:
//
//	fence.acquisitions         counter   {backend, result}
//	fence.wait.duration        histogram {backend, result}, seconds
//	fence.hold.duration        histogram {backend, cause}, seconds
//	fence.leases.lost          counter   {backend, cause}
//	fence.replica_sync.refusals counter  {backend, op}
//	fence.guard.decisions      counter   {decision, class}
//
// The histograms' bucket bounds are fenceprom's defaults, in seconds (5 ms
// to 10 s for waits, 10 ms to 44 min doubling for holds), given as advice
// that a View can override. Lock and resource names are never attribute
// values; Options.Classify maps a guard's resource to its class, at most
// Options.MaxClasses distinct ones (100 by default), "other" past them.
// As in fenceprom, a backend's fence.leases.lost is recorded at 0 for every
// cause, its fence.acquisitions for every result and its
// fence.replica_sync.refusals for both ops, on its first event,
// and a class's two fence.guard.decisions on its first decision, so that an
// alert on a rate fires on the first event too.
//
// It lives in a module of its own so that fence's own go.mod does not
// require OpenTelemetry.
package fenceotel
