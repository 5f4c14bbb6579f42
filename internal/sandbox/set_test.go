package sandbox

import (
	"errors"
	"testing"
	"time"
)

// A set refuses a sandbox past its bound, counting those being created;
// another user's id, or a forged one, is none; an ended sandbox leaves.
func TestSet(t *testing.T) {
	set := NewSet(2)
	a := &Sandbox{ID: newID("sb-"), User: "alice", done: make(chan struct{})}
	relA, err := set.Reserve()
	if err != nil {
		t.Fatal(err)
	}
	relB, err := set.Reserve()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := set.Reserve(); !errors.Is(err, ErrTooMany) {
		t.Errorf("a third reservation of two: %v", err)
	}
	set.Add(a)
	relA()
	relA() // twice is once
	relB()
	if _, err := set.Reserve(); err != nil {
		t.Errorf("a reservation with one place left: %v", err)
	}
	if set.Get("alice", a.ID) != a {
		t.Error("alice does not get her sandbox")
	}
	if set.Get("bob", a.ID) != nil || len(set.List("bob")) != 0 {
		t.Error("bob gets alice's sandbox")
	}
	if set.Get("alice", newID("sb-")) != nil {
		t.Error("a forged id names a sandbox")
	}
	close(a.done)
	deadline := time.Now().Add(10 * time.Second)
	for set.Get("alice", a.ID) != nil {
		if time.Now().After(deadline) {
			t.Fatal("an ended sandbox stays in the set")
		}
		time.Sleep(time.Millisecond)
	}
}

// SetMax moves the bound for the sandboxes to come; after CloseAll the
// set takes none.
func TestSetMaxAndClose(t *testing.T) {
	set := NewSet(2)
	rel, err := set.Reserve()
	if err != nil {
		t.Fatal(err)
	}
	defer rel()
	set.SetMax(1)
	if _, err := set.Reserve(); !errors.Is(err, ErrTooMany) {
		t.Errorf("a second reservation of one: %v", err)
	}
	set.SetMax(3)
	rel2, err := set.Reserve()
	if err != nil {
		t.Fatalf("a second reservation of three: %v", err)
	}
	rel2()
	if err := set.CloseAll(); err != nil {
		t.Fatal(err)
	}
	if _, err := set.Reserve(); !errors.Is(err, ErrClosed) {
		t.Errorf("a reservation after CloseAll: %v", err)
	}
}

// newID has 128 random bits.
func TestNewID(t *testing.T) {
	a, b := newID("sb-"), newID("sb-")
	if a == b || len(a) != len("sb-")+32 {
		t.Errorf("ids %q, %q", a, b)
	}
}
