package cli

import (
	"strings"
	"testing"

	"github.com/fencekit/fence/cmd/fence/internal/doctor"
)

// TestPrintFindingsSummary: the summary line counts the findings in
// English: "1 finding", not "1 findings" (what it printed before, for a
// single persistence-off on a durable primary's replica).
func TestPrintFindingsSummary(t *testing.T) {
	one := doctor.Finding{ID: "appendfsync", Severity: doctor.Warning, Node: "127.0.0.1:6392", Why: "w", Fix: "f"}
	for _, c := range []struct {
		findings []doctor.Finding
		want     string
	}{
		{[]doctor.Finding{one}, "1 finding: 0 critical, 1 warning, 0 info\n"},
		{[]doctor.Finding{one, one}, "2 findings: 0 critical, 2 warning, 0 info\n"},
	} {
		var b strings.Builder
		printFindings(&b, c.findings)
		if !strings.HasSuffix(b.String(), c.want) {
			t.Errorf("printFindings(%d findings) ends %q, want %q", len(c.findings), b.String()[strings.LastIndex(strings.TrimSuffix(b.String(), "\n"), "\n")+1:], c.want)
		}
	}
}
