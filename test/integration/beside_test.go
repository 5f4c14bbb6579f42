package integration

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/server"
	"github.com/agentrun/agentrun/internal/uidpool"
	"github.com/agentrun/agentrun/test/testenv"
)

// TestBesideAnotherAgentrun: the suite's runs, and its leak checks, are
// apart from another agentrun on the host, as an operator's service would
// be: an `agentrun serve` with its own state dir, the default cgroup
// parent and sandbox uids, a full pool and a run going on. Runs of the
// suite on both runtimes pass their leak checks while the other's
// cgroups, uids and processes are there, and the other's pool and run
// are untouched by them.
func TestBesideAnotherAgentrun(t *testing.T) {
	other := testenv.Scope{StateDir: filepath.Join(t.TempDir(), "state"), CgroupParent: config.DefaultCgroupParent,
		UIDFirst: uidpool.DefaultFirst, UIDCount: uidpool.DefaultCount}
	sock := filepath.Join(t.TempDir(), "agentrun.sock")
	cfg := serveConfig(map[string]any{"listen": "unix://" + sock, "pool": map[string]int{pythonImage: 1}},
		map[string]any{"local_images": []string{*imagesDir}, "timeout": "10m"})
	cfg["state_dir"], cfg["store_dir"] = other.StateDir, filepath.Join(other.StateDir, "store")
	cfg["cgroup_parent"] = other.CgroupParent
	cfg["run_uids"] = map[string]int64{"first": other.UIDFirst, "count": other.UIDCount}
	s := startServeWith(t, cfg)

	// A run of the other agentrun goes on throughout, until its client
	// leaves.
	ctx, leave := context.WithCancel(context.Background())
	defer leave()
	req, _ := http.NewRequestWithContext(ctx, "POST", s.base+"/v1/runs",
		strings.NewReader(`{"code": "import time\nprint('started', flush=True)\ntime.sleep(600)", "limits": {"timeout": "10m"}}`))
	done := make(chan error, 1)
	go func() {
		resp, err := s.client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	if !waitSandboxProcess(t, other, pythonProgram, time.Minute) {
		t.Fatalf("the other agentrun's run did not start: %s", s.log())
	}
	// What the suite's leak checks would have counted before they were
	// scoped: the other's cgroups.
	if left := other.Leaks(""); len(left) == 0 {
		t.Fatal("the other agentrun shows nothing on the host: this test proves nothing")
	} else {
		t.Logf("the other agentrun's: %v", left)
	}

	for _, rt := range runtimes {
		res := runIn(t, rt, `{"code": "print(45)"}`)
		if res.Stdout != "45\n" {
			t.Errorf("%s: stdout %q, error %q", rt, res.Stdout, res.Error)
		}
	}
	// The suite's own garbage collection leaves the other's alone.
	if err := gcCLI(t); err != nil {
		t.Errorf("gc: %v", err)
	}
	assertNoLeaks(t)

	var h server.Health
	s.get("/healthz", &h)
	if h.Pool == nil || h.Pool.Ready[pythonImage] != 1 {
		t.Errorf("the other agentrun's pool: %+v; want its sandbox still ready", h.Pool)
	}
	select {
	case err := <-done:
		t.Errorf("the other agentrun's run was answered: %v", err)
	default:
	}
	if !waitSandboxProcess(t, other, pythonProgram, 0) {
		t.Error("the other agentrun's run is gone")
	}
	leave()
	<-done
	s.stop()
	if _, err := os.Stat(other.StateDir); err != nil {
		t.Errorf("the other agentrun's state dir: %v", err)
	}
}
