//go:build !linux

package main

import "errors"

// stopSelf is implemented on Linux only.
func stopSelf() error { return errors.New("QUEUED_TEST_STOP works on Linux only") }
