package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/runner"
	agtask "github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/runtime/spec"
)

// floorName names the contender that does only what the kernel must for
// a sandbox's isolation.
const floorName = "kernel floor (C, no runtime)"

// floorSrc is the floor's C source, from the repository root.
const floorSrc = "test/bench/floor/floor.c"

// floorContender is test/bench/floor/floor.c, built here with the host's
// C compiler: per run the cgroup with agentrun's limits, the namespaces,
// mounts, privileges and seccomp filters of agentrun's spec for task, and
// python3 -c print(45), with no container runtime. Its limits come from
// the spec agentrun builds (runner.SandboxSpec); its seccomp program is
// the one agentrun compiled and keeps in cfg's state dir, after one cold
// run.
func floorContender(work, rootfs, cfg, task string) *contender {
	c := &contender{name: floorName, note: "test/bench/floor/floor.c: clone(2) into the spec's namespaces, the cgroup and its limits, the spec's mounts, pivot_root, caps dropped, uid 65534, agentrun's seccomp filters, exec; nothing else"}
	args, err := floorArgs(rootfs, task)
	if err != nil {
		c.err = err.Error()
		return c
	}
	bin := filepath.Join(work, "floor")
	cc := envOr("CC", "cc")
	if out, err := exec.Command(cc, "-static", "-O2", "-Wall", "-Wextra", "-Werror", "-o", bin, floorSrc).CombinedOutput(); err != nil {
		c.err = fmt.Sprintf("building %s (run the bench from the repository root): %v: %s", floorSrc, err, firstLine(string(out)))
		return c
	}
	prog, err := seccompProgram(work, cfg, task)
	if err != nil {
		c.err = err.Error()
		return c
	}
	args = append([]string{"-s", prog}, args...)
	c.cmd = func(int) *exec.Cmd { return exec.Command(bin, args...) }
	return c
}

// floorArgs are the floor's arguments but its seccomp program: the
// rootfs, the limits of the spec agentrun runs for task, and the program.
func floorArgs(rootfs, task string) ([]string, error) {
	cfg := config.Default()
	data, err := os.ReadFile(task)
	if err != nil {
		return nil, err
	}
	p, err := agtask.Load(data, cfg)
	if err != nil {
		return nil, err
	}
	s, err := spec.New(rootfs, runner.SandboxSpec(p, "/agentrun-bench-floor", cfg.Init, "/workspace", p.Limits.WorkspaceSize)...)
	if err != nil {
		return nil, err
	}
	r := s.Linux.Resources
	if r.Memory == nil || r.Memory.Limit == nil || r.Memory.Swap == nil || r.Pids == nil || r.Pids.Limit == nil || r.CPU == nil || r.CPU.Quota == nil || r.CPU.Period == nil {
		return nil, fmt.Errorf("the sandbox's spec has no memory, pids or cpu limit")
	}
	fsize := rlimit(s, "RLIMIT_FSIZE")
	if fsize == 0 {
		return nil, fmt.Errorf("the sandbox's spec has no RLIMIT_FSIZE")
	}
	n := func(v int64) string { return strconv.FormatInt(v, 10) }
	return []string{"-r", rootfs,
		"-m", n(*r.Memory.Limit), "-w", n(*r.Memory.Swap), "-p", n(*r.Pids.Limit),
		"-q", n(*r.CPU.Quota), "-P", n(int64(*r.CPU.Period)),
		"-t", n(p.Limits.TmpSize), "-W", n(p.Limits.WorkspaceSize), "-f", strconv.FormatUint(fsize, 10),
		"--", "python3", "-c", "print(45)"}, nil
}

// rlimit is the hard value of s's rlimit typ, or 0.
func rlimit(s *specs.Spec, typ string) uint64 {
	for _, l := range s.Process.Rlimits {
		if l.Type == typ {
			return l.Hard
		}
	}
	return 0
}

// seccompProgram runs task once with agentrun (config cfg) and returns
// the path of the seccomp program it compiled and keeps in its state dir
// (runtime/runc/seccomp.go): the filter every sandbox of agentrun loads.
func seccompProgram(work, cfg, task string) (string, error) {
	if out, err := exec.Command(*bin, "run", "--config", cfg, task).CombinedOutput(); err != nil {
		return "", fmt.Errorf("agentrun run, for its seccomp program: %v: %s", err, firstLine(string(out)))
	}
	dir := filepath.Join(work, "state", "seccomp")
	progs, err := filepath.Glob(filepath.Join(dir, "*.bpf"))
	if err != nil {
		return "", err
	}
	if len(progs) != 1 {
		return "", fmt.Errorf("%s holds %d compiled seccomp programs, not 1 (is agentrun-seccomp beside %s?)", dir, len(progs), *bin)
	}
	return progs[0], nil
}
