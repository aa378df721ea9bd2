package fence_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/fencekit/fence"
)

type endCounter struct {
	fence.NopObserver
	ended []fence.LeaseEvent
}

func (c *endCounter) LeaseEnded(ev fence.LeaseEvent) { c.ended = append(c.ended, ev) }

// A lost lease is logged as a warning with its name, token and cause and
// reported; a released one only reported; nil Observer and Logger are fine.
func TestReportLeaseEnded(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	obs := &endCounter{}
	ctx := context.Background()
	lost := fence.LeaseEvent{Backend: "x", Name: "lock:payment:1001", Token: 7, Cause: fence.LostRemoved, Err: errors.New("gone")}
	fence.ReportLeaseEnded(ctx, obs, log, "xlock", lost)
	fence.ReportLeaseEnded(ctx, obs, log, "xlock", fence.LeaseEvent{Backend: "x", Name: "n", Token: 8, Cause: fence.Released})
	fence.ReportLeaseEnded(ctx, nil, nil, "xlock", lost)
	if len(obs.ended) != 2 || obs.ended[0].Token != 7 || obs.ended[1].Cause != fence.Released {
		t.Fatalf("reported %+v", obs.ended)
	}
	out := buf.String()
	if strings.Count(out, "\n") != 1 || !strings.Contains(out, `level=WARN msg="xlock: lease lost" name=lock:payment:1001 token=7 cause=removed error=gone`) {
		t.Fatalf("logged %q", out)
	}
}
