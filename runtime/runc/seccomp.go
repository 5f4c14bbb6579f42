package runc

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/seccomp"
	"github.com/opencontainers/runc/libcontainer/specconv"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	libseccomp "github.com/seccomp/libseccomp-golang"
	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/cachefile"
	"github.com/agentrun/agentrun/runtime/backend"
	"github.com/agentrun/agentrun/runtime/spec"
)

// A sandbox's seccomp filter is compiled once per process, not in every
// container's init.
//
// libcontainer compiles the filter from the spec's rules (Docker's
// profile, some 350 system calls) with libseccomp in each init, and sends
// the rules to it as JSON: together about a quarter of an init's CPU. So
// the backend has libcontainer compile the filter once, in a child
// process of its own (the capture below), and keeps the program it would
// have loaded: libseccomp's filter with libcontainer's own ENOSYS patch,
// and the flags it would have loaded it with. Each container then gets no
// seccomp rules from libcontainer; its program is agentrun-seccomp (a
// small static binary, runtime/runc/seccompexec), which loads that
// program from fd 3 and executes the sandbox's init. It does so as the
// sandbox's user, without capabilities and with no_new_privs, before
// anything of the task runs: the filter the program meets is byte for
// byte the one libcontainer would have installed.
//
// The program is kept in memory for the process, and in the backend's
// SeccompCache for the next one (a CLI run is one process). Without the
// helper, or where the capture fails, the backend leaves the filter to
// libcontainer, as runc does.

// SeccompHelper is the helper's file name.
const SeccompHelper = "agentrun-seccomp"

// seccompHelperPath is where the helper is mounted in the sandbox: the
// sandbox's own /dev tmpfs, beside its init.
const seccompHelperPath = "/dev/agentrun-seccomp"

// programMagic opens a compiled program ("ARSC", little-endian), as the
// helper expects.
const programMagic = 0x43535241

// captureEnv marks the child that compiles a filter.
const captureEnv = "_AGENTRUN_SECCOMP_CAPTURE"

// captureTimeout bounds a capture: a Go process start and one compile
// (a variable for the test of the bound).
var captureTimeout = 10 * time.Second

// maxProgram bounds a compiled program: the kernel's limit of 4096
// instructions and the header.
const maxProgram = 8 + 8*unix.BPF_MAXINSNS

// programs is the process's cache of compiled filters, by fingerprint.
var programs = struct {
	sync.Mutex
	m map[string]*program
}{m: map[string]*program{}}

// program is one compiled filter, in a sealed memfd: every container that
// uses it gets a read-only descriptor of it as fd 3.
type program struct {
	file *os.File // read-only, sealed; nil when the filter is libcontainer's to compile
	err  error    // why not
}

// FindSeccompHelper returns agentrun-seccomp beside the running binary or
// in ../lib/agentrun from it (where make install and the Debian package
// put it: /usr/bin/agentrun, /usr/lib/agentrun/agentrun-seccomp), the
// first fit to run (CheckSeccompHelper), or "".
func FindSeccompHelper() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	dir := filepath.Dir(exe)
	for _, dir := range []string{dir, filepath.Join(dir, "..", "lib", "agentrun")} {
		if p := filepath.Join(dir, SeccompHelper); CheckSeccompHelper(p) == nil {
			return p
		}
	}
	return ""
}

// CheckSeccompHelper checks the host file bin as agentrun-seccomp: every
// sandbox runs it first, so it has the checks of the sandbox's init
// (static, root's, writable by no one else).
func CheckSeccompHelper(bin string) error {
	if err := spec.CheckInit(bin); err != nil {
		return fmt.Errorf("seccomp helper: %w", err)
	}
	return nil
}

// precompiled returns the compiled program of filter f (read-only, shared:
// the caller must not close it), or nil when f is libcontainer's to
// compile in the init (notPrecompiled says why).
func (b *Backend) precompiled(f *specs.LinuxSeccomp) *os.File {
	if b.notPrecompiled(f) != nil {
		return nil
	}
	return b.program(f).file
}

// notPrecompiled says why filter f is libcontainer's to compile in every
// init: no helper, no filter, a filter with a notify action, or a failed
// compile (which is not retried by this process); nil if it is not.
func (b *Backend) notPrecompiled(f *specs.LinuxSeccomp) error {
	switch {
	case b.SeccompHelper == "":
		return fmt.Errorf("no %s (beside the agentrun binary, in ../lib/agentrun from it, or config key seccomp_helper): libcontainer compiles the filter in every container's init", SeccompHelper)
	case f == nil:
		return errors.New("the spec has no seccomp filter")
	case f.ListenerPath != "" || slices.ContainsFunc(f.Syscalls, func(s specs.LinuxSyscall) bool { return s.Action == specs.ActNotify }):
		return errors.New("the filter has a notify action")
	}
	return b.program(f).err
}

// program returns f's entry in the cache, compiling it (or reading it from
// b.SeccompCache) if need be.
func (b *Backend) program(f *specs.LinuxSeccomp) *program {
	key := cacheKey(f)
	programs.Lock()
	defer programs.Unlock()
	p, ok := programs.m[key]
	if !ok {
		p = &program{}
		p.file, p.err = b.loadProgram(f, key)
		programs.m[key] = p
	}
	return p
}

// PrecompiledSeccomp compiles the sandbox's filter (spec.WithSeccomp) if
// this process has not yet, and reports whether it is loaded by the
// helper, and if not, why.
func (b *Backend) PrecompiledSeccomp() error {
	s, err := spec.New("/", spec.WithSeccomp())
	if err != nil {
		return err
	}
	return b.notPrecompiled(s.Linux.Seccomp)
}

// withPrecompiledSeccomp returns a copy of s whose filter the helper loads
// instead of libcontainer: no seccomp rules, the helper mounted read-only
// and run first.
func (b *Backend) withPrecompiledSeccomp(s *specs.Spec) *specs.Spec {
	out := *s
	proc, linux := *s.Process, *s.Linux
	linux.Seccomp = nil
	proc.Args = append([]string{seccompHelperPath}, s.Process.Args...)
	out.Mounts = append(slices.Clip(s.Mounts), specs.Mount{
		Destination: seccompHelperPath, Type: "bind", Source: b.SeccompHelper,
		Options: []string{"bind", "ro", "nosuid", "nodev"},
	})
	out.Process, out.Linux = &proc, &linux
	return &out
}

// loadProgram reads f's program from b.SeccompCache, or compiles it and
// writes it there.
func (b *Backend) loadProgram(f *specs.LinuxSeccomp, key string) (*os.File, error) {
	if b.SeccompCache != "" {
		if prog, err := readCached(filepath.Join(b.SeccompCache, key)); err == nil {
			return sealedFile(prog)
		}
	}
	prog, err := compile(f)
	if err != nil {
		return nil, err
	}
	if b.SeccompCache != "" {
		// The cache only saves the next process a compile.
		_ = writeCached(b.SeccompCache, key, prog)
	}
	return sealedFile(prog)
}

// cacheKey names f's compiled program: its fingerprint, and what else
// the program depends on (libseccomp's and libcontainer's versions, which
// flags the kernel takes).
func cacheKey(f *specs.LinuxSeccomp) string {
	return fmt.Sprintf("%016x-%016x.bpf", fingerprint(f), hostKey())
}

var hostKey = sync.OnceValue(func() uint64 {
	// The bytes are gathered and hashed at once, not written formatted
	// field by field (each string boxed): a one-shot run computes this.
	major, minor, micro := seccomp.Version()
	b := fmt.Appendf(nil, "libseccomp %d.%d.%d\x00", major, minor, micro)
	field := func(s string, end byte) { b = append(append(b, s...), end) }
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		field(unix.ByteSliceToString(u.Release[:]), 0)
		field(unix.ByteSliceToString(u.Version[:]), 0)
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			field(m.Path, ' ')
			field(m.Version, ' ')
			field(m.Sum, 0)
		}
	}
	h := fnv.New64a()
	h.Write(b)
	return h.Sum64()
})

// readCached reads a cached program: a regular file of root's that only
// root may read, of a program's size.
func readCached(path string) ([]byte, error) {
	b, err := cachefile.Read(path, maxProgram)
	if err != nil {
		return nil, err
	}
	return b, checkProgram(b)
}

// writeCached writes prog as dir/key, whole or not at all.
func writeCached(dir, key string, prog []byte) error {
	return cachefile.Write(dir, key, prog)
}

// fingerprint identifies a filter's content.
func fingerprint(f *specs.LinuxSeccomp) uint64 {
	h := fnv.New64a()
	w := func(ss ...string) {
		for _, s := range ss {
			h.Write([]byte(s))
			h.Write([]byte{0})
		}
	}
	n := func(v uint64) { w(strconv.FormatUint(v, 16)) }
	opt := func(p *uint) {
		if p == nil {
			w("-")
		} else {
			n(uint64(*p))
		}
	}
	w(string(f.DefaultAction), f.ListenerPath, f.ListenerMetadata)
	opt(f.DefaultErrnoRet)
	n(uint64(len(f.Architectures)))
	for _, a := range f.Architectures {
		w(string(a))
	}
	if f.Flags == nil {
		w("no flags")
	}
	n(uint64(len(f.Flags)))
	for _, fl := range f.Flags {
		w(string(fl))
	}
	n(uint64(len(f.Syscalls)))
	for _, s := range f.Syscalls {
		n(uint64(len(s.Names)))
		w(s.Names...)
		w(string(s.Action))
		opt(s.ErrnoRet)
		n(uint64(len(s.Args)))
		for _, a := range s.Args {
			n(uint64(a.Index))
			n(a.Value)
			n(a.ValueTwo)
			w(string(a.Op))
		}
	}
	return h.Sum64()
}

// compile has a child process (this binary, by containerInit) compile f
// as libcontainer does in an init, and returns the program it captured.
func compile(f *specs.LinuxSeccomp) ([]byte, error) {
	cfg, err := specconv.SetupSeccomp(f)
	if err != nil {
		return nil, fmt.Errorf("converting the seccomp filter: %w", err)
	}
	in, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), captureTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/proc/self/exe", "seccomp-capture")
	cmd.Env = []string{captureEnv + "=1"}
	cmd.Stdin = bytes.NewReader(in)
	// One byte past the largest program, which checkProgram refuses.
	out, stderr := &backend.CappedBuffer{Max: maxProgram + 1}, &backend.CappedBuffer{Max: 4096}
	cmd.Stdout, cmd.Stderr = out, stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("compiling the seccomp filter: %w: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	b := out.Bytes()
	if err := checkProgram(b); err != nil {
		return nil, err
	}
	return b, nil
}

// checkProgram refuses a captured program the helper could not load.
func checkProgram(b []byte) error {
	if len(b) < 16 || len(b) > maxProgram || (len(b)-8)%8 != 0 || binary.LittleEndian.Uint32(b) != programMagic {
		return fmt.Errorf("the compiled seccomp filter is malformed (%d bytes)", len(b))
	}
	const known = unix.SECCOMP_FILTER_FLAG_TSYNC | unix.SECCOMP_FILTER_FLAG_LOG | unix.SECCOMP_FILTER_FLAG_SPEC_ALLOW
	if fl := binary.LittleEndian.Uint32(b[4:]); fl&^known != 0 {
		return fmt.Errorf("the compiled seccomp filter needs flags %#x", fl)
	}
	return nil
}

// sealedFile returns b in a memfd sealed against any change, opened
// read-only.
func sealedFile(b []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate("agentrun-seccomp", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd for the seccomp filter: %w", err)
	}
	mem := os.NewFile(uintptr(fd), "agentrun-seccomp")
	defer mem.Close()
	if _, err := mem.Write(b); err != nil {
		return nil, fmt.Errorf("writing the seccomp filter: %w", err)
	}
	if _, err := unix.FcntlInt(mem.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_SEAL|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE); err != nil {
		return nil, fmt.Errorf("sealing the seccomp filter: %w", err)
	}
	ro, err := os.Open("/proc/self/fd/" + strconv.Itoa(int(mem.Fd())))
	if err != nil {
		return nil, fmt.Errorf("reopening the seccomp filter: %w", err)
	}
	return ro, nil
}

// captureMain is the child of compile: it reads libcontainer's seccomp
// config on stdin, has libcontainer compile and load it with a filter of
// its own in the way that answers the load and keeps the program, and
// writes that program to stdout. It never returns.
func captureMain() {
	var cfg configs.Seccomp
	if err := json.NewDecoder(io.LimitReader(os.Stdin, 16<<20)).Decode(&cfg); err != nil {
		fmt.Fprintln(os.Stderr, "reading the seccomp config:", err)
		os.Exit(1)
	}
	flags, insns, err := capture(&cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out := binary.LittleEndian.AppendUint32(nil, programMagic)
	out = binary.LittleEndian.AppendUint32(out, flags)
	out = append(out, insns...)
	if _, err := os.Stdout.Write(out); err != nil {
		os.Exit(1)
	}
	os.Exit(0)
}

// capture runs libcontainer's seccomp.InitSeccomp(cfg) on this thread
// (the main one, locked during package init) under a user-notification
// filter that stops its load: prctl(PR_SET_SECCOMP) and
// seccomp(SECCOMP_SET_MODE_FILTER) with a program are answered "done"
// without being run, after the program they pass (and the seccomp flags)
// are read. libseccomp's own probes (a NULL program) run as usual. No
// filter but the notifying one is ever installed.
func capture(cfg *configs.Seccomp) (uint32, []byte, error) {
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return 0, nil, fmt.Errorf("no_new_privs: %w", err)
	}
	trap, err := libseccomp.NewFilter(libseccomp.ActAllow)
	if err != nil {
		return 0, nil, fmt.Errorf("capture filter: %w", err)
	}
	prctl, _ := libseccomp.GetSyscallFromName("prctl")
	sc, _ := libseccomp.GetSyscallFromName("seccomp")
	for _, r := range []struct {
		call libseccomp.ScmpSyscall
		op   uint64
	}{{prctl, unix.PR_SET_SECCOMP}, {sc, unix.SECCOMP_SET_MODE_FILTER}} {
		cond, err := libseccomp.MakeCondition(0, libseccomp.CompareEqual, r.op)
		if err == nil {
			err = trap.AddRuleConditional(r.call, libseccomp.ActNotify, []libseccomp.ScmpCondition{cond})
		}
		if err != nil {
			return 0, nil, fmt.Errorf("capture filter: %w", err)
		}
	}
	if err := trap.Load(); err != nil {
		return 0, nil, fmt.Errorf("loading the capture filter: %w", err)
	}
	fd, err := trap.GetNotifFd()
	if err != nil {
		return 0, nil, fmt.Errorf("capture filter: %w", err)
	}
	type captured struct {
		flags uint32
		insns []byte
		err   error
	}
	// The notifier answers for as long as this process lives: a load that
	// a signal interrupted and the kernel restarted is answered again, the
	// first program kept.
	got := make(chan captured, 1)
	keep := func(c captured) {
		select {
		case got <- c:
		default:
		}
	}
	go func() {
		for {
			req, err := libseccomp.NotifReceive(fd)
			if errors.Is(err, unix.ENOENT) {
				continue // the trapped call was interrupted: it is made again
			}
			if err != nil {
				keep(captured{err: fmt.Errorf("seccomp notification: %w", err)})
				return
			}
			a := req.Data.Args
			flags, prog := a[1], a[2]
			if req.Data.Syscall != sc {
				if a[1] != unix.SECCOMP_MODE_FILTER {
					// Strict mode: never this process's.
					_ = libseccomp.NotifRespond(fd, &libseccomp.ScmpNotifResp{ID: req.ID, Error: int32(unix.EINVAL)})
					continue
				}
				flags = 0
			}
			if prog == 0 {
				// A probe: let the kernel answer it.
				_ = libseccomp.NotifRespond(fd, &libseccomp.ScmpNotifResp{ID: req.ID, Flags: libseccomp.NotifRespFlagContinue})
				continue
			}
			insns, err := readProgram(prog)
			c := captured{flags: uint32(flags), insns: insns, err: err}
			resp := &libseccomp.ScmpNotifResp{ID: req.ID}
			if err != nil {
				resp.Error = int32(unix.EINVAL)
			}
			keep(c) // before the answer lets InitSeccomp return
			_ = libseccomp.NotifRespond(fd, resp)
		}
	}()
	if _, err := seccomp.InitSeccomp(cfg); err != nil {
		return 0, nil, fmt.Errorf("compiling the seccomp filter: %w", err)
	}
	select {
	case c := <-got:
		return c.flags, c.insns, c.err
	default:
		return 0, nil, errors.New("libcontainer compiled the seccomp filter without loading it")
	}
}

// readProgram reads the struct sock_fprog at addr and the instructions it
// points to, from this process's memory (the load that passes them is
// held until it is answered), through /proc/self/mem: no system call a
// host's own filter might refuse.
func readProgram(addr uint64) ([]byte, error) {
	mem, err := os.Open("/proc/self/mem")
	if err != nil {
		return nil, fmt.Errorf("reading the seccomp program: %w", err)
	}
	defer mem.Close()
	var fprog struct { // struct sock_fprog
		Len    uint16
		_      [6]byte
		Filter uint64
	}
	if err := readMem(mem, addr, unsafe.Slice((*byte)(unsafe.Pointer(&fprog)), unsafe.Sizeof(fprog))); err != nil {
		return nil, err
	}
	if fprog.Len == 0 || fprog.Len > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("seccomp program of %d instructions", fprog.Len)
	}
	insns := make([]byte, int(fprog.Len)*int(unsafe.Sizeof(unix.SockFilter{})))
	if err := readMem(mem, fprog.Filter, insns); err != nil {
		return nil, err
	}
	return insns, nil
}

func readMem(mem *os.File, addr uint64, buf []byte) error {
	if addr > 1<<62 {
		return fmt.Errorf("reading the seccomp program: address %#x", addr)
	}
	if _, err := mem.ReadAt(buf, int64(addr)); err != nil {
		return fmt.Errorf("reading the seccomp program: %w", err)
	}
	return nil
}
