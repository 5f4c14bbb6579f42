package runc

import (
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestReadyFollowsTheInit: Ready, through the init's pidfd, is true while
// the init lives (stopped too: Run deals with that one) and false once it
// has ended, before anyone waits for it; false after the init was reaped.
func TestReadyFollowsTheInit(t *testing.T) {
	cmd := exec.Command("/bin/sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	fd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		t.Fatalf("pidfd_open: %v", err)
	}
	p := &Prepared{initFD: fd}
	defer unix.Close(fd)
	if !p.Ready() {
		t.Fatal("not Ready while the init lives")
	}
	if err := cmd.Process.Signal(unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if !p.Ready() {
		t.Fatal("not Ready while the init is stopped")
	}
	if err := cmd.Process.Signal(unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); p.Ready(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("Ready 5s after the init was killed")
		}
	}
	_ = cmd.Wait()
	p.reaped = true
	if p.Ready() {
		t.Error("Ready after the init was reaped")
	}
}
