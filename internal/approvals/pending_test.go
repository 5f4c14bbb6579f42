package approvals

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// A decision that Decide took (its decider answered 200) while the time
// ran out wins: Ask returns it as taken and records it, never as timed
// out. The announcement takes the decision and lets the time run out
// before Ask waits, so that both are ready at once.
func TestApprovalTakenWhileTimingOut(t *testing.T) {
	var a Pending
	timedOut := 0
	a.TimedOut = func() { timedOut++ }
	for i := range 32 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		h := Hold{Run: "ar-x", ID: fmt.Sprintf("ap-%d", i)}
		announce := func() {
			if !a.Decide(h.Run, h.ID, true, "operator (x)", "api") {
				t.Errorf("decide %s: not taken", h.ID)
			}
			<-ctx.Done()
		}
		d := a.Ask(ctx, h, "", announce)
		cancel()
		_, recent := a.List()
		if !d.Approved || !d.Taken || d.By != "operator (x)" || recent[0].By != "operator (x)" || timedOut != 0 {
			t.Fatalf("try %d: decision %+v, recorded by %q, %d timed out; want taken, approved by operator (x)", i, d, recent[0].By, timedOut)
		}
	}
}

// Pending lists the holds waiting, soonest to expire first; a decision
// without a name is recorded under the hold's own label, one that comes
// too late or for no hold is refused, and a hold no one decides is
// recorded as timed out.
func TestPending(t *testing.T) {
	var a Pending
	var counted []string
	a.Counted = func(channel string, ok bool) { counted = append(counted, fmt.Sprintf("%s %v", channel, ok)) }
	now := time.Now()
	later, soon := Hold{Run: "ar-1", ID: "ap-1", ExpiresAt: now.Add(time.Hour)}, Hold{Run: "ar-2", ID: "ap-2", ExpiresAt: now.Add(time.Minute)}
	got := make(chan Decision, 1)
	listed := make(chan []Hold, 1)
	go func() {
		got <- a.Ask(context.Background(), later, "operator (serve API)", func() {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
				defer cancel()
				a.Ask(ctx, soon, "", func() {
					hs, _ := a.List()
					listed <- hs
				})
			}()
		})
	}()
	if hs := <-listed; len(hs) != 2 || hs[0].ID != "ap-2" || hs[1].ID != "ap-1" || a.Count() != 2 {
		t.Fatalf("List() = %+v, Count() = %d; want ap-2 then ap-1", hs, a.Count())
	}
	for _, recent := a.List(); len(recent) == 0; _, recent = a.List() { // ap-2 times out
		time.Sleep(time.Millisecond)
	}
	if a.Count() != 1 || a.Decide("ar-2", "ap-2", true, "", "api") || a.Decide("ar-1", "ap-2", true, "", "api") {
		t.Error("Decide took a decision on no hold waiting")
	}
	if !a.Decide("ar-1", "ap-1", true, "", "page") {
		t.Fatal("Decide ap-1: not taken")
	}
	if d := <-got; !d.Approved || !d.Taken || d.By != "operator (serve API)" {
		t.Errorf("Ask = %+v; want approved, taken, by the hold's label", d)
	}
	_, recent := a.List()
	if len(recent) != 2 || recent[0].ID != "ap-1" || recent[0].By != "operator (serve API)" || recent[1].By != "timeout" || fmt.Sprint(counted) != "[page true]" {
		t.Errorf("recent %+v, counted %v", recent, counted)
	}
}
