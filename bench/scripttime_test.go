package main

import "testing"

// TestScriptTime checks the uncontended workload's time in scripts against
// what the scripts do: fence's acquire and release scripts make 8 calls
// inside the server on an uncontended pair and write two keys, the limit's
// 3 calls and one key.
func TestScriptTime(t *testing.T) {
	ls, err := libs(addr)
	if err != nil {
		t.Fatal(err)
	}
	lim := limit(addr)
	defer func() {
		for _, l := range append(ls, lim) {
			l.close()
		}
	}()
	clock, closeClock := newScriptClock(addr)
	defer closeClock()
	lat, err := uncontended([]*lib{ls[0], lim}, 1000, 0, clock)
	if err != nil {
		t.Fatal(err)
	}
	f, l := lat[0].scriptUS, lat[1].scriptUS
	t.Logf("µs in scripts per pair: %s %.1f, %s %.1f", ls[0].name, f, lim.name, l)
	if !(l > 0 && f > 1.5*l) {
		t.Errorf("want the limit's above 0 and fence's above 1.5× it")
	}
}
