package approvals

import (
	"context"
	"testing"
)

// A decision taken while the time runs out is the one returned, never a
// timeout; once the waiter stopped waiting none is taken.
func TestSlot(t *testing.T) {
	for i := range 32 {
		var s Slot
		ctx, cancel := context.WithCancel(context.Background())
		if !s.Take(Decision{Approved: true, By: "operator (nats)", Taken: true}) {
			t.Fatal("first decision not taken")
		}
		cancel()
		if d := s.Wait(ctx); !d.Approved || !d.Taken {
			t.Fatalf("try %d: wait = %+v; want the decision taken", i, d)
		}
		if s.Take(Decision{By: "operator (second)", Taken: true}) {
			t.Fatal("second decision taken")
		}
	}
	var s Slot
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if d := s.Wait(ctx); d.Taken || d.Approved {
		t.Errorf("wait with none taken = %+v", d)
	}
	if s.Take(Decision{Approved: true, Taken: true}) {
		t.Error("decision taken after the waiter stopped")
	}
}
