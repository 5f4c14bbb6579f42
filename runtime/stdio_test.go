package runtime

import (
	"testing"
	"time"
)

// TestLockCgroupParentRemovals: a removal waits for another removal, however
// long it holds the lock, and then gets it; it does not wait for a run
// being created, and fails instead (that run removes the parent itself).
func TestLockCgroupParentRemovals(t *testing.T) {
	dir := t.TempDir()
	first, err := LockCgroupParent(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		unlock, err := LockCgroupParent(dir, true)
		if err == nil {
			unlock()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("a second removal did not wait for the first: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	first()
	if err := <-got; err != nil {
		t.Fatalf("a removal waiting for another failed: %v", err)
	}

	create, err := LockCgroupParent(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer create()
	go func() {
		unlock, err := LockCgroupParent(dir, true)
		if err == nil {
			unlock()
		}
		got <- err
	}()
	select {
	case err := <-got:
		if err == nil {
			t.Fatal("a removal got the lock while a run was being created")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a removal waited for a run being created")
	}
}
