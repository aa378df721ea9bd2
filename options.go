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
func Wait(d time.Duration) Option { return func(o *Options) { o.Wait = d } }

// TTL sets a fixed lease time: the lease expires ttl after it was granted
// unless extended, and no watchdog renews it. Without TTL the backend's
// watchdog renews the lease every third of its watchdog TTL. ttl must be at
// least a millisecond.
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
	if o.ttlSet {
		if err := ValidateTTL(o.TTL); err != nil {
			return o, err
		}
	}
	return o, nil
}

// ValidateTTL checks a lease time: at least a millisecond. The error matches
// ErrInvalidOption.
func ValidateTTL(ttl time.Duration) error {
	if ttl < time.Millisecond {
		return fmt.Errorf("%w: lease time %v is shorter than 1ms", ErrInvalidOption, ttl)
	}
	return nil
}
