package runc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/runtime/spec"
	"github.com/agentrun/agentrun/test/testenv"
)

func defaultFilter(t *testing.T) *specs.LinuxSeccomp {
	t.Helper()
	s, err := spec.New("/", spec.WithSeccomp())
	if err != nil {
		t.Fatal(err)
	}
	return s.Linux.Seccomp
}

// defaultProgram is the sandbox's filter compiled, and in a sealed file
// as the helper reads it on fd 3 (closed when the test ends).
func defaultProgram(t *testing.T) ([]byte, *os.File) {
	t.Helper()
	prog, err := compile(defaultFilter(t))
	if err != nil {
		t.Fatal(err)
	}
	f, err := sealedFile(prog)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return prog, f
}

func helper(t *testing.T) string {
	t.Helper()
	testenv.RequireRoot(t)
	h, err := testenv.SeccompHelper()
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckSeccompHelper(h); err != nil {
		t.Fatal(err)
	}
	return h
}

// TestFingerprint: the fingerprint is the filter's content, not its
// address: equal for equal rules, different when any part changes.
func TestFingerprint(t *testing.T) {
	a, b := defaultFilter(t), defaultFilter(t)
	if fingerprint(a) != fingerprint(b) {
		t.Fatal("equal filters, different fingerprints")
	}
	changed := *a
	changed.Syscalls = append([]specs.LinuxSyscall(nil), a.Syscalls...)
	changed.Syscalls[3].Names = append([]string{"ptrace"}, changed.Syscalls[3].Names...)
	if fingerprint(&changed) == fingerprint(a) {
		t.Error("a syscall added, same fingerprint")
	}
	changed = *a
	changed.Flags = []specs.LinuxSeccompFlag{}
	if fingerprint(&changed) == fingerprint(a) {
		t.Error("no flags (nil) and an empty set of flags have the same fingerprint; specconv tells them apart")
	}
}

// TestCompile: the capture returns libcontainer's program for the
// sandbox's filter, with its header, the same every time.
func TestCompile(t *testing.T) {
	helper(t)
	one, err := compile(defaultFilter(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := checkProgram(one); err != nil {
		t.Fatal(err)
	}
	// Docker's profile on one ABI, with libcontainer's ENOSYS stub.
	if n := (len(one) - 8) / 8; n < 100 {
		t.Errorf("a program of %d instructions", n)
	}
	two, err := compile(defaultFilter(t))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(one, two) {
		t.Error("two compiles of one filter differ")
	}
}

// TestCheckProgram refuses what the helper could not load.
func TestCheckProgram(t *testing.T) {
	hdr := func(flags uint32) []byte {
		b := binary.LittleEndian.AppendUint32(nil, programMagic)
		return binary.LittleEndian.AppendUint32(b, flags)
	}
	insn := make([]byte, 8)
	for name, b := range map[string][]byte{
		"empty":         nil,
		"no program":    hdr(0),
		"bad magic":     append([]byte("XXXX\x00\x00\x00\x00"), insn...),
		"partial":       append(hdr(0), insn[:5]...),
		"listener flag": append(hdr(8), insn...),
		"too long":      append(hdr(0), make([]byte, 8*4097)...),
	} {
		if checkProgram(b) == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := checkProgram(append(hdr(4), insn...)); err != nil {
		t.Errorf("spec-allow flag: %v", err)
	}
}

// TestCache: a program written to the cache is read back whole; a file
// that others may write, or that is no program, is not used.
func TestCache(t *testing.T) {
	testenv.RequireRoot(t) // the cache uses only files root owns
	dir := t.TempDir()
	prog := append(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, programMagic), 0), make([]byte, 16)...)
	if err := writeCached(dir, "k.bpf", prog); err != nil {
		t.Fatal(err)
	}
	got, err := readCached(filepath.Join(dir, "k.bpf"))
	if err != nil || !bytes.Equal(got, prog) {
		t.Fatalf("read back %x, %v", got, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("the cache holds %d files, want only k.bpf", len(entries))
	}
	if err := os.Chmod(filepath.Join(dir, "k.bpf"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readCached(filepath.Join(dir, "k.bpf")); err == nil {
		t.Error("a cached program others may read was used")
	}
	if err := os.WriteFile(filepath.Join(dir, "bad.bpf"), []byte("not a program"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readCached(filepath.Join(dir, "bad.bpf")); err == nil {
		t.Error("a malformed cached program was used")
	}
	if err := os.Symlink(filepath.Join(dir, "k.bpf"), filepath.Join(dir, "link.bpf")); err != nil {
		t.Fatal(err)
	}
	if _, err := readCached(filepath.Join(dir, "link.bpf")); err == nil {
		t.Error("a symbolic link was followed")
	}
	big := append(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, programMagic), 0), make([]byte, 8*4097)...)
	if err := os.WriteFile(filepath.Join(dir, "big.bpf"), big, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readCached(filepath.Join(dir, "big.bpf")); err == nil {
		t.Error("a cached program past the kernel's 4096 instructions was used")
	}
}

// TestCompileTimeout: a capture that outlives captureTimeout is killed
// and reported, and nothing is compiled.
func TestCompileTimeout(t *testing.T) {
	helper(t)
	defer func(d time.Duration) { captureTimeout = d }(captureTimeout)
	captureTimeout = time.Millisecond
	// Killed, or not started when the deadline passed first.
	if prog, err := compile(defaultFilter(t)); err == nil || !strings.Contains(err.Error(), "killed") && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("compile within 1 ms: %d bytes, %v; want the capture stopped by its deadline", len(prog), err)
	}
}

// TestBackendProgram: a backend with a helper compiles a filter once per
// process and writes it to its cache; one without leaves it to
// libcontainer; a notify action does too.
func TestBackendProgram(t *testing.T) {
	h := helper(t)
	f := defaultFilter(t)
	cache := t.TempDir()
	b := &Backend{SeccompHelper: h, SeccompCache: cache}
	first := b.precompiled(f)
	if first == nil {
		t.Fatalf("no program: %v", b.PrecompiledSeccomp())
	}
	if again := b.precompiled(defaultFilter(t)); again != first {
		t.Error("the same filter was compiled twice in one process")
	}
	if _, err := readCached(filepath.Join(cache, cacheKey(f))); err != nil {
		t.Errorf("not in the cache: %v", err)
	}
	// The shared descriptor is read-only and sealed.
	if _, err := first.Write([]byte("x")); err == nil {
		t.Error("the program's descriptor is writable")
	}
	if (&Backend{}).precompiled(f) != nil {
		t.Error("a backend without a helper precompiled the filter")
	}
	notify := *f
	notify.Syscalls = append(append([]specs.LinuxSyscall(nil), f.Syscalls...), specs.LinuxSyscall{Names: []string{"mkdir"}, Action: specs.ActNotify})
	if b.precompiled(&notify) != nil {
		t.Error("a filter with a notify action was precompiled")
	}
}

// TestHelper: agentrun-seccomp loads the program and runs its arguments
// under it, and runs nothing when it cannot: no program on fd 3, a
// malformed one, or no no_new_privs.
func TestHelper(t *testing.T) {
	h := helper(t)
	prog, good := defaultProgram(t)
	bad, err := sealedFile([]byte("garbage, not a program"))
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	// The flags reach the kernel: one it does not know fails the load.
	badFlag := append([]byte(nil), prog...)
	binary.LittleEndian.PutUint32(badFlag[4:], 1<<31)
	unknownFlag, err := sealedFile(badFlag)
	if err != nil {
		t.Fatal(err)
	}
	defer unknownFlag.Close()

	// The program run under the filter: Docker's profile refuses unshare
	// without CAP_SYS_ADMIN, and root's capabilities do not change that.
	script := `grep '^Seccomp:' /proc/self/status; if unshare --user true 2>/dev/null; then echo unshare allowed; else echo unshare refused; fi; [ -e /proc/self/fd/3 ] && echo fd 3 open; echo ran`
	run := func(fd *os.File, argv ...string) (string, int) {
		cmd := exec.Command(argv[0], argv[1:]...)
		if fd != nil {
			cmd.ExtraFiles = []*os.File{fd}
		}
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), code
	}
	out, code := run(good, "setpriv", "--no-new-privs", h, "/bin/sh", "-c", script)
	if code != 0 || !strings.Contains(out, "Seccomp:\t2") || !strings.Contains(out, "unshare refused") || strings.Contains(out, "fd 3 open") || !strings.Contains(out, "ran") {
		t.Errorf("under the helper: exit %d: %s", code, out)
	}
	// Without the helper the same script may unshare: the refusal above
	// is the filter's.
	if out, _ := run(nil, "/bin/sh", "-c", script); !strings.Contains(out, "unshare allowed") {
		t.Errorf("without the helper: %s", out)
	}
	for _, c := range []struct {
		name string
		fd   *os.File
		nnp  bool
		want string
	}{
		{"no program", nil, true, "reading the filter"},
		{"malformed", bad, true, "malformed"},
		{"no no_new_privs", good, false, "no_new_privs is not set"},
		{"unknown flag", unknownFlag, true, "loading the filter: Invalid argument"},
	} {
		argv := []string{h, "/bin/sh", "-c", "echo ran"}
		if c.nnp {
			argv = append([]string{"setpriv", "--no-new-privs"}, argv...)
		}
		out, code := run(c.fd, argv...)
		if code != 126 || strings.Contains(out, "ran") || !strings.Contains(out, c.want) {
			t.Errorf("%s: exit %d: %q, want 126 and %q, nothing run", c.name, code, out, c.want)
		}
	}
}

// TestHelperHandover: agentrun-seccomp --handover, the start of a pooled
// sandbox's program, runs under the filter the helper loaded before it
// (and loads none of its own), says ready, and executes the program, with
// the channel closed, only after "go", its "ok" and agentrun's close; a
// channel that says anything else or closes first, a process without a
// filter or without no_new_privs, and a malformed call run nothing.
func TestHelperHandover(t *testing.T) {
	h := helper(t)
	_, filter := defaultProgram(t)
	script := `grep -E '^(Seccomp|Seccomp_filters|NoNewPrivs):' /proc/self/status; [ -e /proc/self/fd/4 ] && echo fd 4 open; echo ran "$0"`

	// start runs argv with the filter on fd 3 and a channel's end on fd
	// 4, and returns agentrun's end and the program's result.
	start := func(argv ...string) (*os.File, func() (string, int)) {
		t.Helper()
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		ours, theirs := os.NewFile(uintptr(fds[0]), "ours"), os.NewFile(uintptr(fds[1]), "theirs")
		var out bytes.Buffer
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.ExtraFiles = []*os.File{filter, theirs}
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		theirs.Close()
		t.Cleanup(func() { ours.Close() })
		return ours, func() (string, int) {
			err := cmd.Wait()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			return out.String(), code
		}
	}
	filtered := func(args ...string) []string {
		return append([]string{"setpriv", "--no-new-privs", h, h, "--handover", "4"}, args...)
	}
	// read reads what the start says until it stops, within 10 s.
	read := func(f *os.File) string {
		t.Helper()
		_ = f.SetReadDeadline(time.Now().Add(10 * time.Second))
		b := make([]byte, 64)
		n, _ := f.Read(b)
		return string(b[:n])
	}

	// The hand-over: the program runs in the start's place, under the one
	// filter, its channel closed. "sh" is looked up in PATH, as the init
	// would.
	ch, wait := start(filtered("sh", "-c", script, "the task")...)
	if got := read(ch); got != "ready\n" {
		t.Fatalf("the start said %q, want ready", got)
	}
	if _, err := ch.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	if got := read(ch); got != "ok\n" {
		t.Fatalf("after go the start said %q, want ok", got)
	}
	ch.Close()
	out, code := wait()
	for _, want := range []string{"Seccomp:\t2", "Seccomp_filters:\t1", "NoNewPrivs:\t1", "ran the task"} {
		if !strings.Contains(out, want) {
			t.Errorf("after the hand-over: exit %d, %q; want %q", code, out, want)
		}
	}
	if code != 0 || strings.Contains(out, "fd 4 open") {
		t.Errorf("after the hand-over: exit %d, %q", code, out)
	}

	// What is not the hand-over runs nothing.
	for _, c := range []struct {
		name string
		say  string // agentrun's side after ready; then it closes
	}{
		{"closed", ""},
		{"not go", "run\n"},
		{"go, then more before the close", "go\nmore\n"},
		{"a long line", strings.Repeat("g", 100) + "\n"},
	} {
		ch, wait := start(filtered("sh", "-c", "echo ran")...)
		if got := read(ch); got != "ready\n" {
			t.Fatalf("%s: the start said %q, want ready", c.name, got)
		}
		if c.say != "" {
			if _, err := ch.Write([]byte(c.say)); err != nil {
				t.Fatal(err)
			}
		}
		if c.say == "go\nmore\n" {
			read(ch) // its ok
		}
		ch.Close()
		if out, code := wait(); code != 1 || strings.Contains(out, "ran") {
			t.Errorf("%s: exit %d, %q; want 1, nothing run", c.name, code, out)
		}
	}
	for _, c := range []struct {
		name string
		argv []string
		want string
	}{
		{"no filter", []string{"setpriv", "--no-new-privs", h, "--handover", "4", "sh", "-c", "echo ran"}, "no seccomp filter is loaded"},
		{"no no_new_privs", []string{h, "--handover", "4", "sh", "-c", "echo ran"}, "no_new_privs is not set"},
		{"no program", filtered(), "usage"},
		{"a bad descriptor", append([]string{"setpriv", "--no-new-privs", h, h, "--handover", "1"}, "sh", "-c", "echo ran"), "usage"},
		{"a descriptor not a number", append([]string{"setpriv", "--no-new-privs", h, h, "--handover", "4x"}, "sh", "-c", "echo ran"), "usage"},
	} {
		ch, wait := start(c.argv...)
		ch.Close()
		if out, code := wait(); code != 126 || strings.Contains(out, "ran") || !strings.Contains(out, c.want) {
			t.Errorf("%s: exit %d, %q; want 126 and %q, nothing run", c.name, code, out, c.want)
		}
	}
}
