package integration

import (
	"maps"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/agentrun/agentrun/test/testenv"
)

// TestCgroupParentKept: a run's own cgroup goes with it, but its runtime's
// shared parent cgroup stays, in every hierarchy, and the next run makes
// its cgroup in that same parent, not in one removed and made again (a
// cold run made and removed it every time); `agentrun gc` removes it once
// it is empty.
func TestCgroupParentKept(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		parent := lcParent()
		if rt == "runsc" {
			parent = runscParent()
		}
		for i := range 2 {
			res := runIn(t, rt, `{"code": "print(45)"}`) // and nothing of it left
			if res.Stdout != "45\n" {
				t.Fatalf("run %d: stdout %q, error %q", i, res.Stdout, res.Error)
			}
		}
		kept := cgroupDirs(parent)
		if len(kept) == 0 {
			t.Fatalf("no parent cgroup %s left after a run: runs remove it", parent)
		}
		res := runIn(t, rt, `{"code": "print(45)"}`)
		if res.Stdout != "45\n" {
			t.Fatalf("stdout %q, error %q", res.Stdout, res.Error)
		}
		if again := cgroupDirs(parent); !maps.Equal(again, kept) {
			t.Errorf("the parent cgroup was made again by a run: inodes %v, then %v", kept, again)
		}
		if err := gcCLI(t); err != nil {
			t.Fatal(err)
		}
		if left := cgroupDirs(parent); len(left) > 0 {
			t.Errorf("agentrun gc left the empty parent cgroup: %v", left)
		}
	})
}

// cgroupDirs are the inodes of the cgroup name (under each hierarchy's
// root) where it is there, by directory.
func cgroupDirs(name string) map[string]uint64 {
	dirs := map[string]uint64{}
	for _, root := range testenv.CgroupRoots() {
		d := filepath.Join(root, name)
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			dirs[d] = st.Sys().(*syscall.Stat_t).Ino
		}
	}
	return dirs
}
