package backend

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/test/testenv"
)

// TestExited: a pidfd's process has not ended while it runs or is
// stopped, has once it is killed (before anyone reaps it), and a pidfd
// that cannot be polled counts as ended.
func TestExited(t *testing.T) {
	cmd, fd := testenv.Sleeper(t)
	if Exited(fd) {
		t.Fatal("Exited while the process runs")
	}
	if err := cmd.Process.Signal(unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if Exited(fd) {
		t.Fatal("Exited while the process is stopped")
	}
	if err := cmd.Process.Signal(unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); !Exited(fd); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not Exited 5s after SIGKILL")
		}
	}
	_ = cmd.Wait()
	if !Exited(fd) {
		t.Error("not Exited after the process was reaped")
	}
	if !Exited(-1) {
		t.Error("no pidfd does not count as ended")
	}
	// A number far above the test's own descriptors, so that none takes
	// it over once it is closed.
	const closed = 1000
	if err := unix.Dup2(fd, closed); err != nil {
		t.Fatal(err)
	}
	unix.Close(closed)
	if !Exited(closed) {
		t.Error("a closed pidfd does not count as ended")
	}
}
