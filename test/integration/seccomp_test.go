package integration

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/compose"
	"github.com/agentrun/agentrun/internal/config"
)

// filter is one seccomp filter of a process, as the kernel holds it.
type filter struct {
	insns []unix.SockFilter
	flags uint64 // those the kernel reports: SECCOMP_FILTER_FLAG_LOG
}

// seccompFilters reads the seccomp filters of process pid with ptrace
// (PTRACE_SECCOMP_GET_FILTER and _METADATA: root, not itself under
// seccomp).
func seccompFilters(pid int) (out []filter, err error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.PtraceSeize(pid); err != nil {
		return nil, fmt.Errorf("PTRACE_SEIZE: %w", err)
	}
	defer unix.PtraceDetach(pid)
	if err := unix.PtraceInterrupt(pid); err != nil {
		return nil, fmt.Errorf("PTRACE_INTERRUPT: %w", err)
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, unix.WALL, nil); err != nil || !ws.Stopped() {
		return nil, fmt.Errorf("waiting for the stop: %v (%v)", err, ws)
	}
	ptrace := func(req, idx int, data unsafe.Pointer) (uintptr, error) {
		n, _, e := unix.Syscall6(unix.SYS_PTRACE, uintptr(req), uintptr(pid), uintptr(idx), uintptr(data), 0, 0)
		if e != 0 {
			return 0, e
		}
		return n, nil
	}
	for i := 0; ; i++ {
		n, err := ptrace(unix.PTRACE_SECCOMP_GET_FILTER, i, nil)
		if errors.Is(err, unix.ENOENT) {
			return out, nil
		} else if err != nil {
			return nil, fmt.Errorf("PTRACE_SECCOMP_GET_FILTER %d: %w", i, err)
		}
		f := filter{insns: make([]unix.SockFilter, n)}
		if _, err := ptrace(unix.PTRACE_SECCOMP_GET_FILTER, i, unsafe.Pointer(&f.insns[0])); err != nil {
			return nil, err
		}
		md := struct{ off, flags uint64 }{off: uint64(i)}
		if _, _, err := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SECCOMP_GET_METADATA, uintptr(pid), unsafe.Sizeof(md), uintptr(unsafe.Pointer(&md)), 0, 0); err != 0 {
			return nil, fmt.Errorf("PTRACE_SECCOMP_GET_METADATA %d: %w", i, err)
		}
		f.flags = md.flags
		out = append(out, f)
	}
}

// programFilters runs a program that waits a little, finds it in its
// run's cgroup, reads its filters from the host, and returns its filters,
// its speculation state (which the seccomp flag SPEC_ALLOW sets) and
// what it printed.
func programFilters(t *testing.T, cfg *config.Config) ([]filter, string, string) {
	t.Helper()
	code := `import os, sys, time
print("helper mounted:", os.path.exists("/dev/agentrun-seccomp"))
try:
    os.fstat(3)
    print("fd 3 open")
except OSError:
    pass
sys.stdout.flush()
time.sleep(2)`
	done := make(chan string, 1)
	go func() {
		res := runOnly(t, cfg, nil, pyTask(code, map[string]any{"limits": map[string]any{"timeout": "30s"}}))
		done <- res.Stdout
	}()
	var filters []filter
	var spec string
	var err error
	deadline := time.Now().Add(20 * time.Second)
	for filters == nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		for _, pid := range runPIDs(lcParent()) {
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
			status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			if strings.TrimSpace(string(comm)) != "python3" || !bytes.Contains(status, []byte("Seccomp_filters:\t2")) {
				continue
			}
			if filters, err = seccompFilters(pid); err != nil {
				t.Fatalf("reading the program's filters: %v", err)
			}
			for _, l := range strings.Split(string(status), "\n") {
				if strings.HasPrefix(l, "Speculation_Store_Bypass:") {
					spec = l
				}
			}
			break
		}
	}
	if filters == nil {
		t.Fatal("the program did not start within 20 s")
	}
	out := <-done
	assertNoLeaks(t)
	if spec == "" {
		t.Fatal("no Speculation_Store_Bypass in the program's /proc status")
	}
	return filters, spec, out
}

// TestPrecompiledSeccompIsLibcontainers: the program of a sandbox whose
// filter agentrun compiled once (loaded by agentrun-seccomp) meets the
// very filters, instruction for instruction and with the same flags, of
// a sandbox whose filter libcontainer compiled in its init
// (seccomp_helper "off"), read from the host, and is loaded with the same
// flags (the one the kernel reports, and the speculation state that
// SPEC_ALLOW leaves); the helper's fd is not left open to the program.
func TestPrecompiledSeccompIsLibcontainers(t *testing.T) {
	cfg := testConfig(t)
	fast, fastSpec, out := programFilters(t, cfg)
	if !strings.Contains(out, "helper mounted: True") || strings.Contains(out, "fd 3 open") {
		t.Errorf("with the helper, the program printed %q", out)
	}
	cfg.SeccompHelper = config.SeccompHelperOff
	lc, lcSpec, out := programFilters(t, cfg)
	if !strings.Contains(out, "helper mounted: False") {
		t.Errorf("with seccomp_helper off, the program printed %q", out)
	}
	if fastSpec != lcSpec {
		t.Errorf("with the helper %q, from libcontainer %q", fastSpec, lcSpec)
	}
	// The sandbox's filter, and libcontainer's init's native-ABI one.
	if len(fast) != 2 || len(lc) != 2 {
		t.Fatalf("%d filters with the helper, %d without; want 2 each", len(fast), len(lc))
	}
	for i := range lc {
		if !slices.Equal(fast[i].insns, lc[i].insns) || fast[i].flags != lc[i].flags {
			t.Errorf("filter %d: %d instructions, flags %#x with the helper; %d, flags %#x from libcontainer",
				i, len(fast[i].insns), fast[i].flags, len(lc[i].insns), lc[i].flags)
		}
	}
	if n := max(len(lc[0].insns), len(lc[1].insns)); n < 100 {
		t.Errorf("the sandbox's filter has %d instructions", n)
	}
}

// TestSeccompHelperUnfit: a seccomp_helper that names no fit helper (a
// missing file, or one others may write) stops the runner with the key
// named, before any run.
func TestSeccompHelperUnfit(t *testing.T) {
	writable := filepath.Join(t.TempDir(), "agentrun-seccomp")
	b, err := os.ReadFile(seccompHelper)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(writable, b, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(writable, 0o777); err != nil {
		t.Fatal(err)
	}
	for _, helper := range []string{"/nonexistent/agentrun-seccomp", writable} {
		cfg := testConfig(t)
		cfg.SeccompHelper = helper
		_, err := compose.Runner(cfg, nil)
		if err == nil || !strings.Contains(err.Error(), "seccomp helper") || !strings.Contains(err.Error(), "seccomp_helper") {
			t.Errorf("seccomp_helper %s: %v", helper, err)
		}
	}
}

// TestRunnerPrecompiledSeccomp: the runner compiles the filter ahead with
// the helper, and says why not with seccomp_helper off (serve, worker and
// mcp log it at start).
func TestRunnerPrecompiledSeccomp(t *testing.T) {
	cfg := testConfig(t)
	r, err := compose.Runner(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.PrecompiledSeccomp(); err != nil {
		t.Errorf("with the helper: %v", err)
	}
	cfg.SeccompHelper = config.SeccompHelperOff
	if r, err = compose.Runner(cfg, nil); err != nil {
		t.Fatal(err)
	}
	if err := r.PrecompiledSeccomp(); err == nil || !strings.Contains(err.Error(), "seccomp_helper is off") {
		t.Errorf("with seccomp_helper off: %v", err)
	}
}
