package runc

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/test/testenv"
)

// TestReadyFollowsTheInit: Ready, through the init's pidfd, is true while
// the init lives and false once it has ended (backend.Exited), and false
// once the init has been reaped whatever its pidfd says.
func TestReadyFollowsTheInit(t *testing.T) {
	cmd, fd := testenv.Sleeper(t)
	p := &Prepared{initFD: fd}
	if !p.Ready() {
		t.Fatal("not Ready while the init lives")
	}
	p.reaped = true
	if p.Ready() {
		t.Fatal("Ready after the init was reaped")
	}
	p.reaped = false
	if err := cmd.Process.Signal(unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); p.Ready(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("Ready 5s after the init was killed")
		}
	}
}
