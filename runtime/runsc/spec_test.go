package runsc

import (
	"testing"

	"github.com/agentrun/agentrun/runtime/spec"
)

// gVisor's sockets are its netstack's: the host's per-namespace TCP
// sysctls do not apply and are not passed to runsc.
func TestSpecOptDropsSocketSysctls(t *testing.T) {
	s := spec.Default("/r")
	if len(s.Linux.Sysctl) == 0 {
		t.Fatal("control: the default spec has no sysctls")
	}
	if err := SpecOpt()(s); err != nil {
		t.Fatal(err)
	}
	if len(s.Linux.Sysctl) != 0 {
		t.Errorf("runsc spec keeps sysctls %v", s.Linux.Sysctl)
	}
}
