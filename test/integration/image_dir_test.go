package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrun/agentrun/image/imagetest"
	"github.com/agentrun/agentrun/internal/compose"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
)

// A dir: image without the mount points a container needs runs through a
// private overlay; the directory itself is never changed.
func TestDirImageWithoutMountpointsIsNotModified(t *testing.T) {
	src := strings.TrimPrefix(busyboxImage, "dir:")
	dir := filepath.Join(t.TempDir(), "rootfs")
	if out, err := exec.Command("cp", "-a", src, dir).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	for _, m := range []string{"workspace", "tmp", "proc", "sys", "dev"} {
		os.RemoveAll(filepath.Join(dir, m))
	}
	before := imagetest.HashTree(t, dir)
	res := runTask(t, fmt.Sprintf(`{"image":"dir:%s","command":["/bin/sh","-c","echo ok > /tmp/x && cat /tmp/x && ls /workspace && touch /newfile || echo rofs"]}`, dir))
	if res.Stdout != "ok\nrofs\n" {
		t.Errorf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}
	if after := imagetest.HashTree(t, dir); after != before {
		t.Error("the image directory changed during the run")
	}
}

// SIGTERM to agentrun mid-run kills the sandbox, cleans up and still
// prints a result.
func TestSIGTERMCleansUp(t *testing.T) {
	bin := agentrunBin(t)
	cfg := plainConfig(t)
	cmd := exec.Command(bin, "run", "--config", cfg, "-")
	cmd.Stdin = strings.NewReader(`{"code":"import time\nprint('started', flush=True)\ntime.sleep(60)","limits":{"timeout":"60s"}}`)
	var out strings.Builder
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if !waitSandboxProcess(t, scope, pythonProgram, time.Minute) {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal("the program did not start within a minute")
	}
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatal("agentrun did not exit within 10s of SIGTERM")
	}
	if code := cmd.ProcessState.ExitCode(); code != 125 {
		t.Errorf("exit %d; want 125", code)
	}
	if !strings.Contains(out.String(), "cancelled") {
		t.Errorf("result does not say the run was cancelled: %s", out.String())
	}
	assertNoLeaks(t)
}

// A run cancelled before its program starts (SIGTERM or a client gone
// during the set-up) says so, on either runtime, and leaves nothing.
func TestCancelledBeforeTheProgramStarts(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		cfg := cfgFor(t, rt)
		r, err := compose.Runner(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		plan := loadPlan(t, cfg, "print('ran')", map[string]any{"runtime": rt})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		res := r.Run(ctx, plan, runapi.Hooks{})
		if !strings.Contains(res.Error, "run cancelled before the program started") || res.Stdout != "" {
			t.Errorf("error %q stdout %q; want the run cancelled before its program", res.Error, res.Stdout)
		}
		assertNoLeaks(t)
	})
}

// A run cancelled while its sandbox is being set up stops there (the
// backend's Prepare gets the run's context) and says so, on either
// runtime, and leaves nothing. The cancels are spread over the time one
// set-up takes here, so that they land in each of its steps whatever the
// host's speed; one that comes once the program runs ends the run as a
// cancelled run, which is not said to have been cancelled before its
// program started.
func TestCancelledDuringSetup(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		cfg := cfgFor(t, rt)
		r, err := compose.Runner(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		plan := loadPlan(t, cfg, "import time; print('ran', flush=True); time.sleep(1)", map[string]any{"runtime": rt})
		var setup time.Duration
		res := r.Run(context.Background(), plan, runapi.Hooks{Setup: func(_ bool, d time.Duration) { setup = d }})
		if res.Error != "" || res.Stdout != "ran\n" {
			t.Fatalf("uncancelled run: error %q stdout %q", res.Error, res.Stdout)
		}
		const steps = 8
		for i := range steps + 2 {
			d := setup * time.Duration(i) / steps
			ctx, cancel := context.WithTimeout(context.Background(), d)
			res := r.Run(ctx, plan, runapi.Hooks{})
			cancel()
			switch {
			case strings.Contains(res.Error, "run cancelled before the program started"):
				if res.Stdout != "" || res.ExitCode != result.ExitSetup {
					t.Errorf("cancel after %v: %q, yet stdout %q exit %d", d, res.Error, res.Stdout, res.ExitCode)
				}
			case strings.Contains(res.Error, "run cancelled"):
				t.Logf("cancel after %v of a %v set-up: the program had started", d, setup)
			case res.Error == "" && res.Stdout == "ran\n":
				t.Logf("cancel after %v of a %v set-up: the run ended first", d, setup)
			default:
				t.Errorf("cancel after %v: error %q stdout %q; want the run cancelled", d, res.Error, res.Stdout)
			}
		}
		assertNoLeaks(t)
	})
}
