package redlock

import (
	"time"

	"github.com/fencekit/fence"
)

// SetBeforeReplies makes every acquisition of l call f after sending its
// requests and before reading the replies.
func SetBeforeReplies(l *Locker, f func()) { l.beforeReplies = f }

// SetClock replaces the clock that times acquisitions against their
// validity.
func SetClock(l *Locker, now func() time.Time) { l.now = now }

// SetWallClock replaces the wall clock from which acquisitions propose
// their token floor.
func SetWallClock(l *Locker, now func() time.Time) { l.wall = now }

// ScriptHashes are the SHA1s of the acquire and release scripts, for hooks
// that pick out their calls.
func ScriptHashes() (acquire, release string) { return acquireScript.Hash(), releaseScript.Hash() }

// ExtendHash is the SHA1 of the extend script, for hooks that pick out
// renewals.
func ExtendHash() string { return extendScript.Hash() }

// SetExpiryFired makes every lease of l call f when its expiry timer fires
// and finds the deadline not moved, before it ends the lease.
func SetExpiryFired(l *Locker, f func()) { l.expiryFired = f }

// SetLeaseStarted makes every acquisition of l call f with its lease once
// the lease has started, before the acquisition lists it for Close.
func SetLeaseStarted(l *Locker, f func(fence.Lease)) { l.leaseStarted = f }
