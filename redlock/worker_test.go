package redlock

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

// spawn hands a request to an idle worker rather than starting a goroutine
// (whose stack would grow again), and a worker exits once idle for
// workerIdle: nothing is left running after the last request.
func TestWorkersReusedThenExit(t *testing.T) {
	before := goleak.IgnoreCurrent()
	l := &Locker{work: make(chan func())}
	ran := make(chan struct{})
	l.spawn(func() { ran <- struct{}{} })
	<-ran
	// The worker waits for another request: a send reaches it.
	deadline := time.Now().Add(10 * time.Second)
	for sent := false; !sent; {
		select {
		case l.work <- func() { ran <- struct{}{} }:
			sent = true
		default:
			if time.Now().After(deadline) {
				t.Fatal("no idle worker took a request")
			}
			time.Sleep(time.Millisecond) // polling with a deadline
		}
	}
	<-ran
	// And exits workerIdle after it: goleak retries for longer than that.
	goleak.VerifyNone(t, before)
}
