package state

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestRegisteredRunIsLiveUntilItsLockCloses(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(RunsDir(dir), 0o700); err != nil {
		t.Fatal(err)
	}
	run, lock, err := Register(dir, "ar-0123456789abcdef")
	if err != nil {
		t.Fatal(err)
	}
	if run != filepath.Join(dir, "runs", "ar-0123456789abcdef") {
		t.Errorf("run dir %s", run)
	}
	if _, live := Claim(dir, "ar-0123456789abcdef"); !live {
		t.Fatal("a registered run's lock could be claimed")
	}
	if _, _, err := Register(dir, "ar-0123456789abcdef"); err == nil {
		t.Error("a second run registered under a live run's id")
	}
	lock.Close() // the process that held it died
	l, live := Claim(dir, "ar-0123456789abcdef")
	if live || l == nil {
		t.Fatalf("a dead run: Claim = %v, live %v", l, live)
	}
	l.Close()
}

func TestRegisterWaitsForGC(t *testing.T) {
	dir := t.TempDir()
	os.Mkdir(RunsDir(dir), 0o700)
	g, err := LockGC(dir)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, lock, err := Register(dir, "ar-1")
		if lock != nil {
			lock.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("Register did not wait for gc (%v)", err)
	case <-time.After(50 * time.Millisecond):
	}
	g.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestCgroupParentRemovalGivesWayToCreation(t *testing.T) {
	dir := t.TempDir()
	unlock, err := LockCgroupParent(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LockCgroupParent(dir, true); err == nil || !strings.Contains(err.Error(), "locking cgroup parent") {
		t.Errorf("removal under a creation: %v; want it given up", err)
	}
	unlock()
	unlock, err = LockCgroupParent(dir, true)
	if err != nil {
		t.Fatalf("removal with no creation: %v", err)
	}
	unlock()
}

// TestRemoveCgroupParent: the removal runs under the lock, exclusively;
// not while a run's cgroup is being made, nor where no run was ever made
// (no state dir), and neither is an error.
func TestRemoveCgroupParent(t *testing.T) {
	dir := t.TempDir()
	removed := 0
	remove := func() error {
		removed++
		if f, err := Lock(filepath.Join(dir, cgroupLock), unix.LOCK_SH|unix.LOCK_NB); err == nil {
			f.Close()
			t.Error("a run's cgroup could be made during the removal")
		}
		return nil
	}
	if err := RemoveCgroupParent(dir, remove); err != nil || removed != 1 {
		t.Fatalf("removal: %v, removed %d times; want once", err, removed)
	}
	create, err := LockCgroupParent(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := RemoveCgroupParent(dir, remove); err != nil || removed != 1 {
		t.Errorf("removal during a creation: %v, removed %d times; want none", err, removed)
	}
	create()
	if err := RemoveCgroupParent(filepath.Join(dir, "gone"), remove); err != nil || removed != 1 {
		t.Errorf("removal with no state dir: %v, removed %d times; want none", err, removed)
	}
}

func TestIDs(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"ar-1", "ar-2", "root"} {
		os.Mkdir(filepath.Join(dir, d), 0o700)
	}
	os.WriteFile(filepath.Join(dir, "ar-3"), nil, 0o600)
	ids, err := IDs(dir, func(id string) bool { return id != "root" })
	if err != nil || !slices.Equal(ids, []string{"ar-1", "ar-2"}) {
		t.Errorf("IDs = %v, %v", ids, err)
	}
	if ids, err := IDs(filepath.Join(dir, "gone"), func(string) bool { return true }); err != nil || ids != nil {
		t.Errorf("IDs(missing dir) = %v, %v", ids, err)
	}
}

// TestLockCgroupParentRemovals: a removal waits for another removal, however
// long it holds the lock, and then gets it; it does not wait for a run
// being created, and fails instead (the parent, in use, stays).
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
