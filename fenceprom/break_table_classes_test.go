package fenceprom_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fenceprom"
	"github.com/prometheus/client_golang/prometheus"
)

// TestReadmeClassifyWithTable shares one Observer, with the README's
// Classify (its text copied here), between guard.Middleware (resources
// "payment:1001") and guard.Table, whose documented resource is
// "<Name> <key>" ("payment 1001": no colon). (The events are sent as
// Table.Update sends them, without a database.) With the README's Classify
// cutting at the first colon, each Table key was a class of its own until
// MaxClasses were taken, and from then on every class, the Middleware's
// "payment" included, was "other": the class label said nothing. Before
// the fix: no fence_guard_decisions_total{class="payment"} series at all
// (the 100 Table accepts were 100 classes "payment 0" to "payment 99", the
// Middleware's rejection was "other"); want 100 accepts and 1 rejection.
func TestReadmeClassifyWithTable(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := fenceprom.New(reg, &fenceprom.Options{
		Classify: func(resource string) string {
			if i := strings.IndexAny(resource, ": "); i >= 0 {
				return resource[:i]
			}
			return resource
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range fenceprom.DefaultMaxClasses {
		obs.GuardDecided(fence.GuardEvent{Resource: fmt.Sprintf("payment %d", i), Token: 7, Decision: fence.GuardAccept})
	}
	obs.GuardDecided(fence.GuardEvent{Resource: "payment:1001", Token: 7, Decision: fence.GuardReject})
	for decision, want := range map[fence.GuardDecision]float64{fence.GuardAccept: fenceprom.DefaultMaxClasses, fence.GuardReject: 1} {
		if v, ok := counterValue(t, reg, "fence_guard_decisions_total", map[string]string{"class": "payment", "decision": string(decision)}); !ok || v != want {
			t.Errorf(`fence_guard_decisions_total{class="payment",decision=%q}: %v, present %v; want %v`, decision, v, ok, want)
		}
	}
}
