package worker

import (
	"context"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/internal/approvals"
)

// A decision taken while the time runs out is the one returned, never a
// timeout; once the waiter stopped waiting none is taken.
func TestDecisionSlot(t *testing.T) {
	for i := range 32 {
		var s decisionSlot
		ctx, cancel := context.WithCancel(context.Background())
		if !s.take(approvals.Decision{Approved: true, By: "operator (nats)", Taken: true}) {
			t.Fatal("first decision not taken")
		}
		cancel()
		if d := s.wait(ctx); !d.Approved || !d.Taken {
			t.Fatalf("try %d: wait = %+v; want the decision taken", i, d)
		}
		if s.take(approvals.Decision{By: "operator (second)", Taken: true}) {
			t.Fatal("second decision taken")
		}
	}
	var s decisionSlot
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if d := s.wait(ctx); d.Taken || d.Approved {
		t.Errorf("wait with none taken = %+v", d)
	}
	if s.take(approvals.Decision{Approved: true, Taken: true}) {
		t.Error("decision taken after the waiter stopped")
	}
}

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
	for _, bad := range []string{`{"approve": "yes"}`, `not json`, `{"approve": true, "by": "` + strings.Repeat("x", maxBy+1) + `"}`} {
		if _, err := decisionOf([]byte(bad)); err == nil || !strings.Contains(err.Error(), "want {") {
			t.Errorf("decisionOf(%.30s): %v; want the shape it wants", bad, err)
		}
	}
}
