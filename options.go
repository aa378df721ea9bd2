package fence

import (
	"fmt"
	"time"
)

// Option sets a per-call option of Acquire.
type Option func(*Options)

// Options are the per-call settings of Acquire. Backends read them with
// Apply; callers set them with Wait and TTL.
type Options struct {
	// Wait is how long Acquire waits for a held lock; zero tries once.
	Wait time.Duration
	// TTL is the lease time. Zero means no fixed lease: a watchdog renews
	// the lease until it is released.
	TTL time.Duration

	ttlSet bool // TTL was given, so zero is an error rather than "watchdog"
}

// Wait sets how long Acquire waits for a held lock to be released or to
// expire. The default, zero, tries once. A negative budget is rejected.
// It bounds the waiting, not a server that does not answer: a try already
// sent runs to its reply or to ctx's end, so with a context that has no
// deadline a black-holed Redis holds Acquire for the client's own timeouts
// (go-redis's ReadTimeout, retried: about 5 s with its defaults; for ever
// with ReadTimeout -1). Give ctx a deadline to bound the whole call.
func Wait(d time.Duration) Option { return func(o *Options) { o.Wait = d } }

// TTL sets a fixed lease time: the lease expires ttl after it was granted
// unless extended, and no watchdog renews it. Without TTL the backend's
// watchdog renews the lease every third of its watchdog TTL. ttl must be at
// least MinTTL.
func TTL(ttl time.Duration) Option {
	return func(o *Options) { o.TTL, o.ttlSet = ttl, true }
}

// Apply collects opts and validates them. The error matches
// ErrInvalidOption.
func Apply(opts []Option) (Options, error) {
	var o Options
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.Wait < 0 {
		return o, fmt.Errorf("%w: negative wait %v", ErrInvalidOption, o.Wait)
	}
	// A TTL set by an Option of the caller's own (Options' fields are
	// exported) is checked too: only zero, untouched, means "watchdog".
	if o.ttlSet || o.TTL != 0 {
		if err := ValidateTTL(o.TTL); err != nil {
			return o, err
		}
	}
	return o, nil
}

// MinTTL is the shortest lease time accepted. A lease is known to be held
// only until a deadline measured from before the request was sent, minus an
// allowance for the two clocks running at different rates (redislock takes
// 1% plus 2 ms, Redlock's rule), and it is usable only after the reply came
// back. At 10 ms that allowance is already a fifth of the lease, and one
// round trip on a busy network can eat the rest; a 2 ms lease would end
// before it began, its deadline lying before the request was sent. Redis
// also counts expiries in whole milliseconds.
const MinTTL = 10 * time.Millisecond

// ValidateTTL checks a lease time: at least MinTTL. The error matches
// ErrInvalidOption.
func ValidateTTL(ttl time.Duration) error {
	if ttl < MinTTL {
		return fmt.Errorf("%w: lease time %v is shorter than the minimum %v", ErrInvalidOption, ttl, MinTTL)
	}
	return nil
}
