package fenceprom

import (
	"fmt"
	"math"
	"slices"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/labels"
	"github.com/prometheus/client_golang/prometheus"
)

// Options configure an Observer. The zero value (or nil) gives the
// defaults.
type Options struct {
	// Classify maps a guard's resource name to the class label of
	// fence_guard_decisions_total: "payment" for "payment:1001", say, and
	// for guard.Table's "<Name> <key>", "payment 1001" (so cut at the
	// first ':' or ' ', not at a colon alone, which would make a class of
	// each Table key). It must return few distinct values. Nil labels
	// every decision "". Invalid UTF-8 in a class (which client_golang
	// refuses as a label value) is replaced with U+FFFD.
	//
	// Resources often come from requests, and a Classify that passes
	// through what it does not recognise (the part before a colon, say)
	// would make a label value of each: only the first MaxClasses
	// distinct classes are labels; decisions of any class after them are
	// labelled "other".
	Classify func(resource string) string

	// MaxClasses bounds the distinct class labels (see Classify). Zero
	// means DefaultMaxClasses.
	MaxClasses int

	// WaitBuckets and HoldBuckets are the histograms' buckets, in seconds,
	// strictly increasing and not NaN; New copies them. Nil (or empty)
	// means prometheus.DefBuckets for waits (5 ms to 10 s) and 10 ms to
	// about 44 min, doubling, for holds.
	WaitBuckets, HoldBuckets []float64
}

// DefaultMaxClasses is the default of Options.MaxClasses.
const DefaultMaxClasses = 100

// Observer is a fence.Observer that counts into Prometheus collectors. It
// is safe for concurrent use. Make one with New: the zero Observer (a
// composite literal, say) has no collectors and records nothing, rather
// than panicking inside a locker's Acquire.
type Observer struct {
	classify     func(string) string
	classes      *labels.Classes
	backends     labels.Seen // the backends seen (fixed names: few)
	acquisitions *prometheus.CounterVec
	wait         *prometheus.HistogramVec
	hold         *prometheus.HistogramVec
	lost         *prometheus.CounterVec
	refusals     *prometheus.CounterVec
	decisions    *prometheus.CounterVec
}

var _ fence.Observer = (*Observer)(nil)

// New returns an Observer whose collectors are registered with reg. It
// returns the registration's error (a prometheus.AlreadyRegisteredError
// when another Observer registered them with reg before), and leaves none
// of its collectors registered then. A nil reg, or buckets out of order,
// give an error matching fence.ErrInvalidOption.
func New(reg prometheus.Registerer, opts *Options) (*Observer, error) {
	if reg == nil {
		return nil, fmt.Errorf("fenceprom: %w: nil Registerer", fence.ErrInvalidOption)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	switch {
	case o.MaxClasses < 0:
		return nil, fmt.Errorf("fenceprom: %w: MaxClasses %d is negative", fence.ErrInvalidOption, o.MaxClasses)
	case o.MaxClasses == 0:
		o.MaxClasses = DefaultMaxClasses
	}
	// client_golang keeps the slice it is given, and checks its order only
	// at the first observation, with a panic (in a backend's Acquire).
	var err error
	if o.WaitBuckets, err = buckets("WaitBuckets", o.WaitBuckets, prometheus.DefBuckets); err != nil {
		return nil, err
	}
	if o.HoldBuckets, err = buckets("HoldBuckets", o.HoldBuckets, prometheus.ExponentialBuckets(0.01, 2, 19)); err != nil { // 10 ms … 44 min
		return nil, err
	}
	obs := &Observer{
		classify: o.Classify,
		classes:  labels.NewClasses(o.MaxClasses),
		acquisitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fence_acquisitions_total",
			Help: "Acquire calls by backend and result (acquired, held, not_replicated, cancelled, error).",
		}, []string{"backend", "result"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fence_wait_seconds",
			Help:    "How long Acquire took, waiting for the lock included, by backend and result.",
			Buckets: o.WaitBuckets,
		}, []string{"backend", "result"}),
		hold: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fence_hold_seconds",
			Help:    "How long leases were held, from the grant to their end, by backend and cause of the end.",
			Buckets: o.HoldBuckets,
		}, []string{"backend", "cause"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fence_leases_lost_total",
			Help: "Leases that ended without Release, by backend and cause (expired, renew_failed, renew_late, removed).",
		}, []string{"backend", "cause"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fence_replica_sync_refusals_total",
			Help: "Acquisitions and renewals refused because too few replicas acknowledged them, by backend and op (acquire, renew).",
		}, []string{"backend", "op"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fence_guard_decisions_total",
			Help: "Tokens a guard accepted or rejected as stale, by resource class.",
		}, []string{"decision", "class"}),
	}
	collectors := []prometheus.Collector{obs.acquisitions, obs.wait, obs.hold, obs.lost, obs.refusals, obs.decisions}
	for i, c := range collectors {
		if err := reg.Register(c); err != nil {
			// Those registered would stay behind, and make every later
			// New with reg fail.
			for _, r := range collectors[:i] {
				reg.Unregister(r)
			}
			return nil, err
		}
	}
	return obs, nil
}

// buckets returns a copy of b, or def if b is empty, or an error matching
// fence.ErrInvalidOption if b is not strictly increasing or holds a NaN.
func buckets(field string, b, def []float64) ([]float64, error) {
	if len(b) == 0 {
		return def, nil
	}
	for i, v := range b {
		if math.IsNaN(v) || (i > 0 && v <= b[i-1]) {
			return nil, fmt.Errorf("fenceprom: %w: %s %v not strictly increasing", fence.ErrInvalidOption, field, b)
		}
	}
	return slices.Clone(b), nil
}

// lossCauses are the causes that fence_leases_lost_total counts.
var lossCauses = [...]fence.LeaseCause{fence.LostExpired, fence.LostRenewFailed, fence.LostRenewLate, fence.LostRemoved}

// acquireResults are the results that fence_acquisitions_total counts.
var acquireResults = [...]fence.AcquireResult{fence.Acquired, fence.Held, fence.NotReplicated, fence.Cancelled, fence.Failed}

// syncOps are the ops that fence_replica_sync_refusals_total counts.
var syncOps = [...]string{"acquire", "renew"}

// sawBackend creates backend's fence_leases_lost_total,
// fence_acquisitions_total and fence_replica_sync_refusals_total series at
// 0 when it is first seen: a rate or increase over a series that appears
// at 1 is nothing, and the alert on the first lost lease (or failed
// acquisition, or refusal) would not fire.
func (o *Observer) sawBackend(backend string) {
	if !o.backends.First(backend) {
		return
	}
	for _, c := range lossCauses {
		o.lost.WithLabelValues(backend, string(c))
	}
	for _, r := range acquireResults {
		o.acquisitions.WithLabelValues(backend, string(r))
	}
	for _, op := range syncOps {
		o.refusals.WithLabelValues(backend, op)
	}
}

// AcquireDone counts an Acquire and records how long it took.
func (o *Observer) AcquireDone(e fence.AcquireEvent) {
	if o.zero() {
		return
	}
	o.sawBackend(e.Backend)
	o.acquisitions.WithLabelValues(e.Backend, string(e.Result)).Inc()
	o.wait.WithLabelValues(e.Backend, string(e.Result)).Observe(e.Wait.Seconds())
}

// LeaseEnded records how long a lease was held and counts it if it was
// lost.
func (o *Observer) LeaseEnded(e fence.LeaseEvent) {
	if o.zero() {
		return
	}
	o.sawBackend(e.Backend)
	o.hold.WithLabelValues(e.Backend, string(e.Cause)).Observe(e.Held.Seconds())
	if e.Cause != fence.Released {
		o.lost.WithLabelValues(e.Backend, string(e.Cause)).Inc()
	}
}

// ReplicaSyncRefused counts a refusal. Its acked and required counts are
// not labels: they are known only at a refusal, and no series made at 0
// before it could carry them (the locker's Logger logs them, and fence
// doctor reports connected and expected replicas).
func (o *Observer) ReplicaSyncRefused(e fence.ReplicaSyncEvent) {
	if o.zero() {
		return
	}
	o.sawBackend(e.Backend)
	op := "acquire"
	if e.Renewal {
		op = "renew"
	}
	o.refusals.WithLabelValues(e.Backend, op).Inc()
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
		// Both decisions' series at 0, for the same reason as sawBackend.
		o.decisions.WithLabelValues(string(fence.GuardAccept), class)
		o.decisions.WithLabelValues(string(fence.GuardReject), class)
	}
	o.decisions.WithLabelValues(string(e.Decision), class).Inc()
}

// zero reports whether o is the zero Observer, made without New.
func (o *Observer) zero() bool { return o.acquisitions == nil }
