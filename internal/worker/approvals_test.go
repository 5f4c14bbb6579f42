package worker

import (
	"context"
	"testing"

	"github.com/agentrun/agentrun/proxy"
)

// A decision taken while the time runs out is the one returned, never a
// timeout; once the waiter stopped waiting none is taken.
func TestDecisionSlot(t *testing.T) {
	for i := range 32 {
		var s decisionSlot
		ctx, cancel := context.WithCancel(context.Background())
		if !s.take(proxy.Decision{Approved: true, By: "operator (nats)", Taken: true}) {
			t.Fatal("first decision not taken")
		}
		cancel()
		if d := s.wait(ctx); !d.Approved || !d.Taken {
			t.Fatalf("try %d: wait = %+v; want the decision taken", i, d)
		}
		if s.take(proxy.Decision{By: "operator (second)", Taken: true}) {
			t.Fatal("second decision taken")
		}
	}
	var s decisionSlot
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if d := s.wait(ctx); d.Taken || d.Approved {
		t.Errorf("wait with none taken = %+v", d)
	}
	if s.take(proxy.Decision{Approved: true, Taken: true}) {
		t.Error("decision taken after the waiter stopped")
	}
}
