package runner

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/runtime/cgroup"
	"github.com/agentrun/agentrun/test/testenv"
)

// gc's cleanToolCgroups of a dead run kills the processes of its stdio
// tool servers' cgroups and removes them, leaving another run's, and
// removes the tools' cgroup parent once it is empty.
func TestCleanToolCgroups(t *testing.T) {
	testenv.RequireRoot(t)
	cfg := config.Default()
	cfg.StateDir = t.TempDir()
	cfg.CgroupParent = "/agentrun-test-runner-tools-" + filepath.Base(cfg.StateDir)
	r := &Runner{cfg: cfg}
	parent := cfg.ToolsCgroupParent()
	start := func(name string) (*cgroup.Cgroup, *exec.Cmd) {
		cg, err := cgroup.New(parent+"/"+name, nil)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if err := cg.Join(cmd.Process.Pid); err != nil {
			cmd.Process.Kill()
			t.Fatal(err)
		}
		return cg, cmd
	}
	dead, deadCmd := start("tool-ar-dead1-ev")
	other, otherCmd := start("tool-ar-live2-ev")
	t.Cleanup(func() {
		deadCmd.Process.Kill()
		otherCmd.Process.Kill()
		other.Kill()
		other.Remove()
		dead.Remove()
		r.removeToolsParent()
	})
	done := make(chan error, 1)
	go func() { done <- deadCmd.Wait() }()

	if err := r.cleanToolCgroups("ar-dead1"); err != nil {
		t.Fatalf("cleanToolCgroups: %v", err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the dead run's tool server process still runs")
	}
	if pids := other.Pids(); len(pids) != 1 {
		t.Errorf("the other run's tool server: pids %v; want its one process left", pids)
	}
	for _, root := range testenv.CgroupRoots() {
		if _, err := os.Stat(filepath.Join(root, parent, "tool-ar-dead1-ev")); err == nil {
			t.Errorf("the dead run's cgroup is left in %s", root)
		}
	}

	otherCmd.Process.Kill()
	otherCmd.Wait()
	if err := r.cleanToolCgroups("ar-live2"); err != nil {
		t.Fatalf("cleanToolCgroups: %v", err)
	}
	for _, root := range testenv.CgroupRoots() {
		if _, err := os.Stat(filepath.Join(root, parent)); err == nil {
			t.Errorf("the tools' cgroup parent is left in %s, empty", root)
		}
	}
}

// deadRunOwner: gc reclaims the uid of a run whose dir is gone and of each
// of its stdio tool servers (the run's dir, then "/tool-" and the name),
// never a live run's, nor another state dir's.
func TestDeadRunOwner(t *testing.T) {
	runs := t.TempDir()
	live := filepath.Join(runs, "ar-live")
	if err := os.Mkdir(live, 0o700); err != nil {
		t.Fatal(err)
	}
	dead := filepath.Join(runs, "ar-dead")
	for owner, want := range map[string]bool{
		live: false, live + "/tool-ev": false,
		dead: true, dead + "/tool-ev": true,
		dead + "/other": false, dead + "/tool-ev/x": false,
		"/elsewhere/runs/ar-dead": false, "/elsewhere/runs/ar-dead/tool-ev": false,
	} {
		if got := deadRunOwner(runs, owner); got != want {
			t.Errorf("deadRunOwner(%s) = %v; want %v", owner, got, want)
		}
	}
}
