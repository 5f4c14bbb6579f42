package mcpserver

import (
	"context"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type testHeld = held[string, string, string]

// work starts a held call whose work asks q and ends with its answer, or
// with "cancelled" when ended.
func work(q string) *testHeld {
	ctx, cancel := context.WithCancel(context.Background())
	h := newHeld[string, string, string](cancel)
	go func() {
		a, ok := h.ask(ctx, "q-"+q, q)
		if !ok {
			a = "cancelled"
		}
		h.result <- a
	}()
	return h
}

// TestHeldRoundTrip: a question becomes the call's answer; the retry's
// answer reaches the work, whose end is the retry's answer.
func TestHeldRoundTrip(t *testing.T) {
	var hc heldCalls[string, string, string]
	r, q := hc.await(context.Background(), work("may I?"), "busy")
	if q == nil || q.pending.q != "may I?" || q.pending.id != "q-may I?" || q.state == "" {
		t.Fatalf("await: %q %+v", r, q)
	}
	h := hc.take(q.state)
	if h != q || hc.take(q.state) != nil {
		t.Fatal("take: the call is not taken once")
	}
	h.answer("yes")
	if r, q := hc.await(context.Background(), h, "busy"); q != nil || r != "yes" {
		t.Errorf("after the answer: %q %+v", r, q)
	}
}

// TestHeldBounds: with maxHeldCalls waiting, a question is answered busy;
// a call whose client never comes back is ended after abandonAfter; a
// cancelled wait ends the work.
func TestHeldBounds(t *testing.T) {
	var hc heldCalls[string, string, string]
	for range maxHeldCalls {
		if _, q := hc.await(context.Background(), work("q"), "busy"); q == nil {
			t.Fatal("a question was not held")
		}
	}
	if r, q := hc.await(context.Background(), work("one more"), "busy"); q != nil || r != "busy" {
		t.Errorf("past maxHeldCalls: %q %+v; want answered busy", r, q)
	}

	defer func(d time.Duration) { abandonAfter = d }(abandonAfter)
	abandonAfter = 50 * time.Millisecond
	var hc2 heldCalls[string, string, string]
	_, q := hc2.await(context.Background(), work("q"), "busy")
	select {
	case r := <-q.result:
		if r != "cancelled" || hc2.take(q.state) != nil {
			t.Errorf("abandoned: %q", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an abandoned call's work was not ended")
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	h := work("q")
	// The question may come first: the work is ended either way.
	for r, q := hc2.await(ctx, h, "busy"); ; r, q = hc2.await(ctx, h, "busy") {
		if q == nil {
			if r != "cancelled" {
				t.Errorf("a cancelled wait: %q", r)
			}
			break
		}
		hc2.take(q.state)
	}
}

// TestForwardElicitUnknownCall: a question about no call of the
// forwarding server is declined.
func TestForwardElicitUnknownCall(t *testing.T) {
	r := &remote{}
	for _, meta := range []mcp.Meta{nil, {forwardedCallKey: "fc-nothere"}, {forwardedCallKey: 7}} {
		a, err := r.elicit(context.Background(), &mcp.ElicitRequest{Params: &mcp.ElicitParams{Meta: meta, Message: "?"}})
		if err != nil || a.Action != "decline" {
			t.Errorf("meta %v: %+v %v; want declined", meta, a, err)
		}
	}
}
