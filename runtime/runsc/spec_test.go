package runsc

import (
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

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

// clone3's flags are in memory, out of any filter's reach: under gVisor
// it is refused by the one trace rule (ENOSYS there), as Docker's errno
// rule refuses it under libcontainer, and no other rule names it.
func TestSpecOptRefusesClone3(t *testing.T) {
	s, err := spec.New("/r", spec.WithSeccomp())
	if err != nil {
		t.Fatal(err)
	}
	if err := SpecOpt()(s); err != nil {
		t.Fatal(err)
	}
	var rules []specs.LinuxSyscall
	for _, r := range s.Linux.Seccomp.Syscalls {
		if slices.Contains(r.Names, "clone3") {
			rules = append(rules, r)
		}
	}
	if len(rules) != 1 || len(rules[0].Names) != 1 || rules[0].Action != specs.ActTrace || len(rules[0].Args) != 0 {
		t.Errorf("clone3's rules under runsc: %+v; want the one trace rule", rules)
	}
}
