package fenceprom

import (
	"strconv"
	"strings"

	"github.com/fencekit/fence"
	"github.com/prometheus/client_golang/prometheus"
)

// Options configure an Observer. The zero value (or nil) gives the
// defaults.
type Options struct {
	// Classify maps a guard's resource name to the class label of
	// fence_guard_decisions_total: "payment" for "payment:1001", say. It
	// must return few distinct values. Nil labels every decision "".
	// Invalid UTF-8 in a class (which client_golang refuses as a label
	// value) is replaced with U+FFFD.
	Classify func(resource string) string

	// WaitBuckets and HoldBuckets are the histograms' buckets, in seconds.
	// Nil means prometheus.DefBuckets for waits (5 ms to 10 s) and
	// 10 ms to about 1 h, doubling, for holds.
	WaitBuckets, HoldBuckets []float64
}

// Observer is a fence.Observer that counts into Prometheus collectors. It
// is safe for concurrent use.
type Observer struct {
	classify     func(string) string
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
// when another Observer registered them with reg before).
func New(reg prometheus.Registerer, opts *Options) (*Observer, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.WaitBuckets == nil {
		o.WaitBuckets = prometheus.DefBuckets
	}
	if o.HoldBuckets == nil {
		o.HoldBuckets = prometheus.ExponentialBuckets(0.01, 2, 19) // 10 ms … 43 min
	}
	obs := &Observer{
		classify: o.Classify,
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
			Help: "Acquisitions and renewals refused because too few replicas acknowledged them, by acknowledged and required counts.",
		}, []string{"backend", "op", "acked", "required"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fence_guard_decisions_total",
			Help: "Tokens a guard accepted or rejected as stale, by resource class.",
		}, []string{"decision", "class"}),
	}
	for _, c := range []prometheus.Collector{obs.acquisitions, obs.wait, obs.hold, obs.lost, obs.refusals, obs.decisions} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return obs, nil
}

// AcquireDone counts an Acquire and records how long it took.
func (o *Observer) AcquireDone(e fence.AcquireEvent) {
	o.acquisitions.WithLabelValues(e.Backend, string(e.Result)).Inc()
	o.wait.WithLabelValues(e.Backend, string(e.Result)).Observe(e.Wait.Seconds())
}

// LeaseEnded records how long a lease was held and counts it if it was
// lost.
func (o *Observer) LeaseEnded(e fence.LeaseEvent) {
	o.hold.WithLabelValues(e.Backend, string(e.Cause)).Observe(e.Held.Seconds())
	if e.Cause != fence.Released {
		o.lost.WithLabelValues(e.Backend, string(e.Cause)).Inc()
	}
}

// ReplicaSyncRefused counts a refusal.
func (o *Observer) ReplicaSyncRefused(e fence.ReplicaSyncEvent) {
	op := "acquire"
	if e.Renewal {
		op = "renew"
	}
	o.refusals.WithLabelValues(e.Backend, op, strconv.Itoa(e.Acked), strconv.Itoa(e.Required)).Inc()
}

// GuardDecided counts a guard's decision under its resource's class.
func (o *Observer) GuardDecided(e fence.GuardEvent) {
	class := ""
	if o.classify != nil {
		class = strings.ToValidUTF8(o.classify(e.Resource), "\uFFFD")
	}
	o.decisions.WithLabelValues(string(e.Decision), class).Inc()
}
