package session

import (
	"errors"
	"testing"
	"time"
)

// TestLockWaitsForAnEndingHolder: a session held by a run that has not
// answered is refused at once; once its holder has answered (Ending), the
// next Lock waits for its Release and gets the session, while a third,
// meanwhile, is refused at once; gc's lock never waits.
func TestLockWaitsForAnEndingHolder(t *testing.T) {
	s := testStore(t)
	id, err := s.Create()
	if err != nil {
		t.Fatal(err)
	}
	first, err := s.Lock(id)
	if err != nil {
		t.Fatal(err)
	}
	begun := time.Now()
	if _, err := s.Lock(id); !errors.Is(err, ErrBusy) {
		t.Fatalf("Lock of a held session = %v; want ErrBusy", err)
	}
	if waited := time.Since(begun); waited > time.Second {
		t.Fatalf("Lock of a held session took %s; want a refusal at once", waited)
	}
	if !s.busy(id) {
		t.Error("busy = false for a held session")
	}
	first.Ending()
	if s.busy(id) {
		t.Error("busy = true for a session whose holder is ending (its next run waits, and must not be refused)")
	}
	if _, err := s.lock(id, 0); !errors.Is(err, ErrBusy) {
		t.Fatalf("gc's lock of an ending session = %v; want ErrBusy", err)
	}
	got := make(chan error, 1)
	var second *Lease
	go func() {
		l, err := s.Lock(id)
		second = l
		got <- err
	}()
	// The second waits for the use, holding the call: a third is
	// refused at once (it may run before the second has the call, and
	// then waits for the first's Release too: either way it does not get
	// the session while the first holds it).
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-got:
		t.Fatalf("Lock returned %v before the ending holder let go", err)
	default:
	}
	if _, err := s.lock(id, 0); !errors.Is(err, ErrBusy) {
		t.Fatalf("a third Lock while the second waits = %v; want ErrBusy", err)
	}
	first.Release()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("Lock after the ending holder's Release = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Lock did not return after the ending holder's Release")
	}
	if _, err := s.lock(id, 0); !errors.Is(err, ErrBusy) {
		t.Fatalf("Lock while the second holds it = %v; want ErrBusy", err)
	}
	second.Release()
	l, err := s.lock(id, 0)
	if err != nil {
		t.Fatalf("Lock of a free session = %v", err)
	}
	l.Release()
}
