package fenceotel

import (
	"context"
	"errors"
	"fmt"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/labels"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Options configure an Observer. The zero value (or nil) gives the
// defaults.
type Options struct {
	// Classify maps a guard's resource name to the class attribute of
	// fence.guard.decisions. It must return few distinct values. Nil
	// gives every decision the class "". Invalid UTF-8 in a class (which
	// an OTLP exporter cannot marshal) is replaced with U+FFFD.
	//
	// Resources often come from requests, and a Classify that passes
	// through what it does not recognise (the part before a colon, say)
	// would make an attribute value of each: only the first MaxClasses
	// distinct classes are kept; decisions of any class after them get
	// the class "other".
	Classify func(resource string) string

	// MaxClasses bounds the distinct class values (see Classify). Zero
	// means DefaultMaxClasses.
	MaxClasses int
}

// DefaultMaxClasses is the default of Options.MaxClasses.
const DefaultMaxClasses = 100

// Observer is a fence.Observer that records into OpenTelemetry
// instruments. It is safe for concurrent use. Make one with New: the zero
// Observer (a composite literal, say) has no instruments and records
// nothing, rather than panicking inside a locker's Acquire.
type Observer struct {
	classify     func(string) string
	classes      *labels.Classes
	backends     *labels.Seen // the backends seen (fixed names: few)
	acquisitions metric.Int64Counter
	wait         metric.Float64Histogram
	hold         metric.Float64Histogram
	lost         metric.Int64Counter
	refusals     metric.Int64Counter
	decisions    metric.Int64Counter
}

var _ fence.Observer = (*Observer)(nil)

// The histograms' bucket bounds, in seconds: fenceprom's defaults. The
// SDK's own (0, 5, 10 … 10000) are made for milliseconds. A View can
// still replace them.
var (
	// prometheus.DefBuckets: 5 ms … 10 s.
	waitBounds = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
	holdBounds = func() []float64 {
		// 10 ms … 44 min, doubling.
		b := make([]float64, 19)
		for i := range b {
			b[i] = 0.01 * float64(int(1)<<i)
		}
		return b
	}()
)

// New returns an Observer whose instruments meter creates. It returns the
// errors of creating them, and one matching fence.ErrInvalidOption for a
// nil meter.
func New(meter metric.Meter, opts *Options) (*Observer, error) {
	if meter == nil {
		return nil, fmt.Errorf("fenceotel: %w: nil Meter", fence.ErrInvalidOption)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	switch {
	case o.MaxClasses < 0:
		return nil, fmt.Errorf("fenceotel: %w: MaxClasses %d is negative", fence.ErrInvalidOption, o.MaxClasses)
	case o.MaxClasses == 0:
		o.MaxClasses = DefaultMaxClasses
	}
	obs := &Observer{classify: o.Classify, classes: labels.NewClasses(o.MaxClasses), backends: &labels.Seen{}}
	var errs [6]error
	obs.acquisitions, errs[0] = meter.Int64Counter("fence.acquisitions",
		metric.WithDescription("Acquire calls by backend and result (acquired, held, not_replicated, cancelled, error)."),
		metric.WithUnit("{acquisition}"))
	obs.wait, errs[1] = meter.Float64Histogram("fence.wait.duration",
		metric.WithDescription("How long Acquire took, waiting for the lock included, by backend and result."),
		metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(waitBounds...))
	obs.hold, errs[2] = meter.Float64Histogram("fence.hold.duration",
		metric.WithDescription("How long leases were held, from the grant to their end, by backend and cause of the end."),
		metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(holdBounds...))
	obs.lost, errs[3] = meter.Int64Counter("fence.leases.lost",
		metric.WithDescription("Leases that ended without Release, by backend and cause (expired, renew_failed, renew_late, removed)."),
		metric.WithUnit("{lease}"))
	obs.refusals, errs[4] = meter.Int64Counter("fence.replica_sync.refusals",
		metric.WithDescription("Acquisitions and renewals refused because too few replicas acknowledged them."),
		metric.WithUnit("{refusal}"))
	obs.decisions, errs[5] = meter.Int64Counter("fence.guard.decisions",
		metric.WithDescription("Tokens a guard accepted or rejected as stale, by resource class."),
		metric.WithUnit("{decision}"))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	return obs, nil
}

// The events come without a context; the instruments do not need one.
var background = context.Background()

// lossCauses are the causes that fence.leases.lost counts.
var lossCauses = [...]fence.LeaseCause{fence.LostExpired, fence.LostRenewFailed, fence.LostRenewLate, fence.LostRemoved}

// acquireResults are the results that fence.acquisitions counts.
var acquireResults = [...]fence.AcquireResult{fence.Acquired, fence.Held, fence.NotReplicated, fence.Cancelled, fence.Failed}

// sawBackend adds 0 to backend's fence.leases.lost for every cause, to its
// fence.acquisitions for every result, and to its
// fence.replica_sync.refusals for both ops, when the backend is first seen:
// a rate or increase over a series that appears at 1 is nothing, and the
// alert on the first lost lease (or failed acquisition) would not fire.
func (o *Observer) sawBackend(backend string) {
	if !o.backends.First(backend) {
		return
	}
	for _, c := range lossCauses {
		o.lost.Add(background, 0, metric.WithAttributes(attribute.String("backend", backend), attribute.String("cause", string(c))))
	}
	for _, r := range acquireResults {
		o.acquisitions.Add(background, 0, metric.WithAttributes(attribute.String("backend", backend), attribute.String("result", string(r))))
	}
	for _, op := range [...]string{"acquire", "renew"} {
		o.refusals.Add(background, 0, metric.WithAttributes(attribute.String("backend", backend), attribute.String("op", op)))
	}
}

// AcquireDone counts an Acquire and records how long it took.
func (o *Observer) AcquireDone(e fence.AcquireEvent) {
	if o.zero() {
		return
	}
	o.sawBackend(e.Backend)
	attrs := metric.WithAttributes(attribute.String("backend", e.Backend), attribute.String("result", string(e.Result)))
	o.acquisitions.Add(background, 1, attrs)
	o.wait.Record(background, e.Wait.Seconds(), attrs)
}

// LeaseEnded records how long a lease was held and counts it if it was
// lost.
func (o *Observer) LeaseEnded(e fence.LeaseEvent) {
	if o.zero() {
		return
	}
	o.sawBackend(e.Backend)
	attrs := metric.WithAttributes(attribute.String("backend", e.Backend), attribute.String("cause", string(e.Cause)))
	o.hold.Record(background, e.Held.Seconds(), attrs)
	if e.Cause != fence.Released {
		o.lost.Add(background, 1, attrs)
	}
}

// ReplicaSyncRefused counts a refusal.
func (o *Observer) ReplicaSyncRefused(e fence.ReplicaSyncEvent) {
	if o.zero() {
		return
	}
	o.sawBackend(e.Backend)
	op := "acquire"
	if e.Renewal {
		op = "renew"
	}
	// Not the acked and required counts: known only at a refusal, they
	// would make its series appear at 1, unseen by an alert on its
	// increase. They are in the event, and in redislock's log line.
	o.refusals.Add(background, 1, metric.WithAttributes(attribute.String("backend", e.Backend), attribute.String("op", op)))
}

// GuardDecided counts a guard's decision under its resource's class.
func (o *Observer) GuardDecided(e fence.GuardEvent) {
	if o.zero() {
		return
	}
	class := ""
	if o.classify != nil {
		class = o.classify(e.Resource)
	}
	class, first := o.classes.Label(class)
	if first {
		// Both decisions at 0, for the same reason as sawBackend.
		for _, d := range []fence.GuardDecision{fence.GuardAccept, fence.GuardReject} {
			o.decisions.Add(background, 0, metric.WithAttributes(attribute.String("decision", string(d)), attribute.String("class", class)))
		}
	}
	o.decisions.Add(background, 1, metric.WithAttributes(attribute.String("decision", string(e.Decision)), attribute.String("class", class)))
}

// zero reports whether o is the zero Observer, made without New.
func (o *Observer) zero() bool { return o.acquisitions == nil }
