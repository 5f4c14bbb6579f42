package approvals

import (
	"context"
	"strings"
	"testing"
	"time"
)

// Ask says how a hold ended: decided in time, timed out, or withdrawn
// with its request; a decision taken counts even when the time has run
// out by the time the approver returns, and one not taken does not.
func TestAsk(t *testing.T) {
	answer := func(d Decision) Func {
		return func(ctx context.Context, _ Approval) Decision {
			<-ctx.Done()
			return d
		}
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		approve Func
		want    End
	}{
		{"answered", context.Background(), func(context.Context, Approval) Decision { return Decision{Approved: true} }, Answered},
		{"timed out", context.Background(), answer(Decision{Approved: true}), TimedOut},
		{"taken as it timed out", context.Background(), answer(Decision{Approved: true, Taken: true}), Answered},
		{"withdrawn", ended, answer(Decision{Approved: true}), Withdrawn},
		{"taken as it was withdrawn", ended, answer(Decision{Approved: true, Taken: true}), Answered},
	} {
		d, end := Ask(tc.ctx, tc.approve, Approval{ID: NewID()}, time.Millisecond)
		if end != tc.want || (end == Answered && !d.Approved) {
			t.Errorf("%s: Ask = %+v, %v; want %v", tc.name, d, end, tc.want)
		}
	}
	if Timeout(0) != DefaultTimeout || Timeout(-1) != DefaultTimeout || Timeout(time.Second) != time.Second {
		t.Errorf("Timeout: %v, %v, %v", Timeout(0), Timeout(-1), Timeout(time.Second))
	}
	if id := NewID(); !strings.HasPrefix(id, "ap-") || len(id) != 19 || id == NewID() {
		t.Errorf("NewID() = %q", id)
	}
}
