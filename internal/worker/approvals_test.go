package worker

import (
	"strings"
	"testing"

	"github.com/agentrun/agentrun/internal/approvals"
)

// A name given with a decision over NATS is recorded under the channel's
// label, never as a label of its own: "--by page" does not read as the
// approvals page's decision, nor "--by webhook" as the webhook's.
func TestDecisionByKeptApartFromChannels(t *testing.T) {
	for data, want := range map[string]string{
		`{"approve": true}`:                           "operator (nats)",
		`{"approve": true, "by": "alice"}`:            "operator (nats: alice)",
		`{"approve": true, "by": "page"}`:             "operator (nats: page)",
		`{"approve": true, "by": "webhook"}`:          "operator (nats: webhook)",
		`{"approve": true, "by": "serve API: alice"}`: "operator (nats: serve API: alice)",
		`{"approve": true, "by": "nats"}`:             "operator (nats: nats)",
		`{"approve": true, "by": "a\u202e"}`:          `operator (nats: a\u202e)`,
	} {
		d, err := decisionOf([]byte(data))
		if err != nil || d.By != want || !d.Approved || !d.Taken {
			t.Errorf("decisionOf(%s) = %+v, %v; want approved, taken, by %q", data, d, err, want)
		}
	}
	for _, bad := range []string{`{"approve": "yes"}`, `not json`, `{"approve": true, "by": "` + strings.Repeat("x", approvals.MaxName+1) + `"}`} {
		if _, err := decisionOf([]byte(bad)); err == nil || !strings.Contains(err.Error(), "want {") {
			t.Errorf("decisionOf(%.30s): %v; want the shape it wants", bad, err)
		}
	}
}
