package sandbox

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/errkind"
)

// A set refuses a sandbox past its bound, counting those being created;
// another user's id, or a forged one, is none; an ended sandbox leaves.
func TestSet(t *testing.T) {
	set := NewSet(2)
	a := &Sandbox{ID: newID("sb-"), User: "alice", done: make(chan struct{})}
	relA, err := set.Reserve("alice", 0)
	if err != nil {
		t.Fatal(err)
	}
	relB, err := set.Reserve("alice", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := set.Reserve("alice", 0); !errors.Is(err, ErrTooMany) {
		t.Errorf("a third reservation of two: %v", err)
	}
	set.Add(a)
	relA()
	relA() // twice is once
	relB()
	if _, err := set.Reserve("alice", 0); err != nil {
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

// SetBounds moves the bound for the sandboxes to come; after CloseAll the
// set takes none.
func TestSetMaxAndClose(t *testing.T) {
	set := NewSet(2)
	rel, err := set.Reserve("alice", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rel()
	set.SetBounds(Bounds{Max: 1})
	if _, err := set.Reserve("alice", 0); !errors.Is(err, ErrTooMany) {
		t.Errorf("a second reservation of one: %v", err)
	}
	set.SetBounds(Bounds{Max: 3})
	rel2, err := set.Reserve("alice", 0)
	if err != nil {
		t.Fatalf("a second reservation of three: %v", err)
	}
	rel2()
	if err := set.CloseAll(); err != nil {
		t.Fatal(err)
	}
	if _, err := set.Reserve("alice", 0); !errors.Is(err, ErrClosed) {
		t.Errorf("a reservation after CloseAll: %v", err)
	}
}

// A set bounds each user's sandboxes (sandboxes.per_user) and the sum
// of their memory limits (sandboxes.max_memory), those being created and
// those live, and gives both back as a creation fails or a sandbox ends;
// each refusal names its bound.
func TestSetPerUserAndMemory(t *testing.T) {
	const mib = 1 << 20
	set := NewSet(10)
	set.SetBounds(Bounds{Max: 10, PerUser: 2, Memory: 512 * mib})
	a1, err := set.Reserve("alice", 256*mib)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := set.Reserve("alice", 0); err != nil {
		t.Fatalf("alice's second: %v", err)
	}
	_, err = set.Reserve("alice", 0)
	if !errors.Is(err, ErrQuota) || !strings.Contains(err.Error(), "sandboxes.per_user is 2") {
		t.Errorf("alice's third of two: %v", err)
	}
	// Bob is not bound by alice's count, but by the memory they share.
	_, err = set.Reserve("bob", 512*mib)
	if !errors.Is(err, ErrTooMany) || !strings.Contains(err.Error(), "sandboxes.max_memory") {
		t.Errorf("bob's 512m beside alice's 256m, of 512m: %v", err)
	}
	_, err = set.Reserve("bob", 513*mib)
	if errkind.Of(err) != errkind.Policy || !strings.Contains(err.Error(), "sandboxes.max_memory") {
		t.Errorf("bob's 513m, of 512m, on its own: %v", err)
	}
	b1, err := set.Reserve("bob", 256*mib)
	if err != nil {
		t.Fatalf("bob's 256m beside alice's 256m, of 512m: %v", err)
	}
	b1() // failed: given back
	// Alice's first is created, and lives on after its reservation.
	a := &Sandbox{ID: newID("sb-"), User: "alice", memory: 256 * mib, done: make(chan struct{})}
	if err := set.Add(a); err != nil {
		t.Fatal(err)
	}
	a1()
	if _, err := set.Reserve("bob", 257*mib); !errors.Is(err, ErrTooMany) {
		t.Errorf("bob's 257m beside alice's live 256m, of 512m: %v", err)
	}
	close(a.done)
	deadline := time.Now().Add(10 * time.Second)
	for {
		rel, err := set.Reserve("bob", 512*mib)
		if err == nil {
			rel()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("an ended sandbox's memory stays counted: %v", err)
		}
		time.Sleep(time.Millisecond)
	}
}

// newID has 128 random bits.
func TestNewID(t *testing.T) {
	a, b := newID("sb-"), newID("sb-")
	if a == b || len(a) != len("sb-")+32 {
		t.Errorf("ids %q, %q", a, b)
	}
}
