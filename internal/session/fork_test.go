package session

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/test/testenv"
)

// testStore is a store of 16m sessions in directories of the test's own.
func testStore(t *testing.T) *Store {
	t.Helper()
	testenv.RequireRoot(t)
	cfg := config.Default()
	cfg.StoreDir, cfg.StateDir = t.TempDir(), t.TempDir()
	cfg.Sessions.MaxBytes = config.MustSize("16m")
	cfg.Sessions.Max = 4
	s, err := Open(cfg, 65534, 65534)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestForkCopiesFilesAndRollsBack: each copy holds the source's workspace
// and the state file beside its disk, independent of the others; a bad
// count, a fork past sessions.max and a failure at the second copy leave
// nothing behind.
func TestForkCopiesFilesAndRollsBack(t *testing.T) {
	s := testStore(t)
	id, err := s.Create()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WriteFile(id, "a.txt", strings.NewReader("from the source")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.path(id, "state.bin"), []byte("state"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, -1, MaxFork + 1} {
		if _, err := s.Fork(context.Background(), id, n); !errors.Is(err, ErrBadCount) {
			t.Errorf("Fork(%d) = %v; want ErrBadCount", n, err)
		}
	}
	if _, err := s.Fork(context.Background(), id, 4); !errors.Is(err, ErrFull) {
		t.Errorf("Fork past sessions.max = %v; want ErrFull", err)
	}
	forkHook = func(i int) error {
		if i == 1 {
			return errors.New("injected")
		}
		return nil
	}
	_, err = s.Fork(context.Background(), id, 2)
	forkHook = nil
	if err == nil {
		t.Fatal("Fork with a failing second copy succeeded")
	}
	if ents, _ := os.ReadDir(s.dir); len(ents) != 2 { // .lock and the source
		t.Errorf("a failed fork left %d entries", len(ents))
	}
	f, err := s.Fork(context.Background(), id, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("mode %s, %d bytes copied", f.Mode, f.Copied)
	if err := s.WriteFile(f.IDs[0], "a.txt", strings.NewReader("changed")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ id, want string }{{id, "from the source"}, {f.IDs[0], "changed"}, {f.IDs[1], "from the source"}} {
		got, err := s.ReadFile(c.id, "a.txt")
		if err != nil || string(got) != c.want {
			t.Errorf("%s: a.txt = %q, %v; want %q", c.id, got, err, c.want)
		}
		if st, err := os.ReadFile(filepath.Join(s.dir, c.id, "state.bin")); err != nil || string(st) != "state" {
			t.Errorf("%s: state.bin = %q, %v", c.id, st, err)
		}
		if in, err := s.Get(c.id); err != nil || in.Busy {
			t.Errorf("%s: %+v, %v", c.id, in, err)
		}
	}
}
