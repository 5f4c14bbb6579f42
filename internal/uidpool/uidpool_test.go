package uidpool

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/agentrun/agentrun/internal/uidrange"
)

// TestTakeConcurrent: takers at once never get the same id, every id is
// in the range, and the one past the range's size is refused.
func TestTakeConcurrent(t *testing.T) {
	p, err := Open(filepath.Join(t.TempDir(), "uids"), 100000, 64)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	got := map[uint32]string{}
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			owner := fmt.Sprintf("/run/agentrun/state/runs/ar-%d", i)
			id, err := p.Take(owner)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if prev, dup := got[id]; dup {
				t.Errorf("id %d given to %s and %s", id, prev, owner)
			}
			got[id] = owner
		})
	}
	wg.Wait()
	for id := range got {
		if id < p.first || id-p.first >= p.count {
			t.Errorf("id %d outside 100000+64", id)
		}
	}
	if _, err := p.Take("/run/agentrun/state/runs/ar-late"); !errors.Is(err, ErrExhausted) {
		t.Errorf("Take with the range full: %v", err)
	}
	held, err := p.Held()
	if err != nil || len(held) != 64 {
		t.Fatalf("Held: %d, %v", len(held), err)
	}
	for id, owner := range got {
		if held[id] != owner {
			t.Errorf("held[%d] = %q, want %q", id, held[id], owner)
		}
	}
}

// TestFreeOnlyOwner: Free by another owner leaves the reservation; by
// the owner it frees it, and the id can be taken again.
func TestFreeOnlyOwner(t *testing.T) {
	p, err := Open(t.TempDir(), 100000, 1)
	if err != nil {
		t.Fatal(err)
	}
	id, err := p.Take("/s/runs/ar-a")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Free(id, "/s/runs/ar-b"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Take("/s/runs/ar-b"); !errors.Is(err, ErrExhausted) {
		t.Fatalf("Free by another owner freed the id: %v", err)
	}
	if err := p.Free(id, "/s/runs/ar-a"); err != nil {
		t.Fatal(err)
	}
	if again, err := p.Take("/s/runs/ar-b"); err != nil || again != id {
		t.Fatalf("Take after Free: %d, %v", again, err)
	}
}

// TestReclaim frees the reservations of dead owners only.
func TestReclaim(t *testing.T) {
	dir := t.TempDir()
	p, err := Open(dir, 100000, 8)
	if err != nil {
		t.Fatal(err)
	}
	owners := map[string]uint32{}
	for _, o := range []string{"/s/runs/ar-live", "/s/runs/ar-dead1", "/s/runs/ar-dead2"} {
		if owners[o], err = p.Take(o); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(dir, "junk"), nil, 0o600) // not a reservation: ignored
	freed, err := p.Reclaim(func(o string) bool { return o != "/s/runs/ar-live" })
	if err != nil || len(freed) != 2 {
		t.Fatalf("Reclaim: %v, %v", freed, err)
	}
	held, _ := p.Held()
	if len(held) != 1 || held[owners["/s/runs/ar-live"]] != "/s/runs/ar-live" {
		t.Fatalf("after Reclaim: %v", held)
	}
}

// TestSharedDir: two agentrun processes with state dirs of their own and
// one range (a one-id range here) reserve in one dir: the second gets no
// id while the first holds it, and the gc of the second's state dir never
// frees the first's reservation.
func TestSharedDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "agentrun", "uids")
	a, err := Open(dir, 100000, 1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(dir, 100000, 1)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Dir(dir)); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("the reservations dir's parent: %v, %v; want 0755", st.Mode(), err)
	}
	id, err := a.Take("/run/serve/runs/ar-1")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := b.Take("/run/worker/runs/ar-2"); !errors.Is(err, ErrExhausted) {
		t.Fatalf("the second state dir got id %d (%v) while the first holds %d", got, err, id)
	}
	// The worker's gc: only its own runs can be dead to it.
	freed, err := b.Reclaim(func(o string) bool { return filepath.Dir(o) == "/run/worker/runs" })
	if err != nil || len(freed) != 0 {
		t.Errorf("the second's gc freed %v (%v)", freed, err)
	}
	if err := a.Free(id, "/run/serve/runs/ar-1"); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Take("/run/worker/runs/ar-2"); err != nil || got != id {
		t.Errorf("Take once free: %d, %v", got, err)
	}
}

func TestCheck(t *testing.T) {
	for _, c := range []struct {
		first, count int64
		ok           bool
	}{
		{DefaultFirst, DefaultCount, true},
		{65536, 1, true},
		{MaxID, 1, true},
		{MaxID, 2, false},
		{65535, 10, false},
		{0, 10, false},
		{100000, 0, false},
		{-1, 10, false},
	} {
		if err := uidrange.Check(c.first, c.count); (err == nil) != c.ok {
			t.Errorf("Check(%d, %d) = %v", c.first, c.count, err)
		}
	}
	for _, owner := range []string{"ar-1", "runs/ar-1", "/s/runs/../ar-1", ""} {
		if _, err := (&Range{}).Take(owner); err == nil {
			t.Errorf("Take of owner %q, not a clean absolute path", owner)
		}
	}
}

func TestHostNames(t *testing.T) {
	dir := t.TempDir()
	passwd, group := filepath.Join(dir, "passwd"), filepath.Join(dir, "group")
	os.WriteFile(passwd, []byte("root:x:0:0::/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\nodd:x:2000000005:1::/:/bin/false\n# comment\n"), 0o600)
	os.WriteFile(group, []byte("root:x:0:\nclash:x:2000065535:\npast:x:2000065536:\n"), 0o600)
	got, err := HostNames(DefaultFirst, DefaultCount, passwd, group)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"passwd odd (2000000005)", "group clash (2000065535)"}; !slices.Equal(got, want) {
		t.Errorf("HostNames = %q, want %q", got, want)
	}
	if _, err := HostNames(DefaultFirst, DefaultCount, filepath.Join(dir, "none")); err == nil {
		t.Error("HostNames of a missing file")
	}
}
