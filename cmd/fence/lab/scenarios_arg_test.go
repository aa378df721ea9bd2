package lab

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestRunUnknownScenario: a scenario number the lab does not have is an
// error before anything runs. Before, Run built the worker, ran nothing and
// returned an empty report without an error, and fence lab --scenario 99
// then said "a control showed no violation or a protected run showed one".
func TestRunUnknownScenario(t *testing.T) {
	for _, ns := range [][]int{{99}, {0}, {1, 14}} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		rep, err := Run(ctx, Config{Scenarios: ns, Worker: []string{"/nonexistent/labworker"}})
		cancel()
		if err == nil || !strings.Contains(err.Error(), "no scenario") {
			t.Errorf("Run(scenarios %v) = %d results, err %v; want an error naming the unknown scenario", ns, len(rep.Results), err)
		}
		if len(rep.Results) > 0 {
			t.Errorf("Run(scenarios %v) ran %d rows before refusing", ns, len(rep.Results))
		}
	}
	if err := CheckScenarios([]int{1, QueueScenario}); err != nil {
		t.Errorf("CheckScenarios(1, %d) = %v, want nil", QueueScenario, err)
	}
}
