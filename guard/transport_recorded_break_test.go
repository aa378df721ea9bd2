package guard_test

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/memlock"
)

// seeOther answers the first request with a 303 to /page whose
// Fence-Recorded-Call lines are recorded, and every other with 200,
// keeping the Fence-Recorded-Call lines it was sent; it sends nothing.
type seeOther struct {
	recorded []string
	asked    int
	sent     []string // the follow-up's Fence-Recorded-Call lines
}

func (s *seeOther) RoundTrip(req *http.Request) (*http.Response, error) {
	s.asked++
	resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("")), Request: req}
	if s.asked == 1 {
		resp.StatusCode = http.StatusSeeOther
		resp.Header.Set("Location", "/page")
		resp.Header[guard.RecordedCallHeader] = s.recorded
	} else {
		s.sent = req.Header.Values(guard.RecordedCallHeader)
	}
	return resp, nil
}

// TestTransportCarriesRecordedList: the 303 of a POST lists the ids that
// the fenced layers it went through recorded the call under (Gate's and
// Middleware's behind it: two lines, or one with commas), and Transport
// sends them all on the follow-up, one a line. It took only a single
// valid id: with two, it sent none (before: the follow-up carried [] for
// ["req-g" "req-m"] and for ["req-g, req-m"]), and the follow-up was
// stale at the first layer. Still carried whole or not at all: nothing
// from a list of more than 4 ids, or with an empty or invalid member.
func TestTransportCarriesRecordedList(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := memlock.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctx, "lock:payment:1001", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ answer, sent []string }{
		{[]string{"req-g"}, []string{"req-g"}},
		{[]string{"req-g", "req-m"}, []string{"req-g", "req-m"}},
		{[]string{"req-g, req-m"}, []string{"req-g", "req-m"}},
		{[]string{"a", "b,c", "d"}, []string{"a", "b", "c", "d"}},
		{[]string{"a", "b", "c", "d", "e"}, nil},
		{[]string{"a,b,c", "d,e"}, nil},
		{[]string{"req-g", "req m"}, nil},
		{[]string{"req-g", ""}, nil},
		{[]string{"req-g,"}, nil},
	} {
		base := &seeOther{recorded: tc.answer}
		c := &http.Client{Transport: &guard.Transport{Base: base, Lease: lease}}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://h.test/approve", strings.NewReader("approve"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if base.asked != 2 || !slices.Equal(base.sent, tc.sent) {
			t.Errorf("303 with %s %q: asked %d times, the follow-up carried %q; want 2, %q", guard.RecordedCallHeader, tc.answer, base.asked, base.sent, tc.sent)
		}
	}
}
