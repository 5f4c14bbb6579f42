package main

import (
	"bufio"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestFloorArgs: the floor gets the limits of agentrun's spec for the
// task: memory and memory+swap alike, the pids cap with the init's one,
// half a CPU per 100 ms period.
func TestFloorArgs(t *testing.T) {
	task := filepath.Join(t.TempDir(), "task.json")
	if err := os.WriteFile(task, []byte(`{"code":"print(45)","limits":{"memory":"128m","pids":10,"cpus":0.5}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	args, err := floorArgs("/rootfs", task)
	if err != nil {
		t.Fatal(err)
	}
	flags := map[string]string{}
	for i := 0; i+1 < len(args) && args[i] != "--"; i += 2 {
		flags[args[i]] = args[i+1]
	}
	for f, want := range map[string]string{"-r": "/rootfs", "-m": "134217728", "-w": "134217728", "-p": "11", "-q": "50000", "-P": "100000"} {
		if flags[f] != want {
			t.Errorf("floorArgs %s = %q; want %q (%q)", f, flags[f], want, args)
		}
	}
	if !slices.Equal(args[len(args)-4:], []string{"--", "python3", "-c", "print(45)"}) {
		t.Errorf("floorArgs ends %q; want -- python3 -c print(45)", args[len(args)-4:])
	}
	if _, err := floorArgs("/rootfs", filepath.Join(t.TempDir(), "none.json")); err == nil {
		t.Error("floorArgs of a missing task: no error")
	}
}

// TestFloorSandbox runs floor.c (root): the program runs as 65534 with no
// capabilities, no_new_privs and a seccomp filter, alone in its
// namespaces (lo up, the only link), in the cgroup with the limits it was given; the cgroup is
// gone when floor returns.
func TestFloorSandbox(t *testing.T) {
	if os.Geteuid() != 0 {
		// test/testenv.RequireRoot, whose package's -images flag is the
		// bench's own.
		if os.Getenv("AGENTRUN_TEST_ROOT") == "1" {
			t.Fatal("needs root (cgroups, namespaces, mounts) ($AGENTRUN_TEST_ROOT=1)")
		}
		t.Skip("needs root (cgroups, namespaces, mounts)")
	}
	rootfs := filepath.Join(*images, "python", "rootfs")
	if _, err := os.Stat(filepath.Join(rootfs, "usr", "bin", "python3")); err != nil {
		t.Fatalf("the python test image is missing (make images): %v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "floor")
	if out, err := exec.Command(envOr("CC", "cc"), "-static", "-O2", "-Wall", "-Wextra", "-Werror", "-o", bin, "floor/floor.c").CombinedOutput(); err != nil {
		t.Fatalf("building floor.c: %v: %s", err, out)
	}
	// A program that allows every call: the filter's load is what is tested.
	prog := binary.LittleEndian.AppendUint32(nil, 0x43535241)
	prog = binary.LittleEndian.AppendUint32(prog, 0)
	prog = append(prog, 0x06, 0, 0, 0, 0, 0, 0xff, 0x7f) // BPF_RET|BPF_K SECCOMP_RET_ALLOW
	progFile := filepath.Join(dir, "prog.bpf")
	if err := os.WriteFile(progFile, prog, 0o600); err != nil {
		t.Fatal(err)
	}
	const check = `import os, socket, sys
print("ready", flush=True)
sys.stdin.read()
st = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
print(os.getuid(), os.getgid(), st["CapEff"].strip(), st["CapBnd"].strip(), st["NoNewPrivs"].strip(), st["Seccomp"].strip(),
      socket.gethostname(), os.getpid(), ",".join(sorted(os.listdir("/sys/class/net"))), open("/sys/class/net/lo/flags").read().strip(), os.getcwd())
`
	cmd := exec.Command(bin, "-r", filepath.Join(*images, "python", "rootfs"), "-s", progFile,
		"-m", "134217728", "-w", "134217728", "-p", "33", "-q", "50000", "-P", "100000",
		"-t", "1048576", "-W", "1048576", "-f", "2097152", "--", "python3", "-c", check)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	out := bufio.NewReader(stdout)
	if l, err := out.ReadString('\n'); l != "ready\n" {
		t.Fatalf("floor: %q %v: %s", l, err, stderr.String())
	}
	cgroups := floorCgroups(cmd.Process.Pid)
	for file, want := range cgroups {
		b, err := os.ReadFile(file)
		if err != nil || strings.TrimSpace(string(b)) != want {
			t.Errorf("%s = %q, %v; want %q", file, b, err, want)
		}
	}
	stdin.Close()
	rest, _ := out.ReadString('\n')
	if err := cmd.Wait(); err != nil {
		t.Fatalf("floor: %v: %s", err, stderr.String())
	}
	if want := "65534 65534 0000000000000000 0000000000000000 1 2 sandbox 1 lo 0x9 /workspace\n"; rest != want {
		t.Errorf("in the sandbox: %q; want %q", rest, want)
	}
	for file := range cgroups {
		if _, err := os.Stat(filepath.Dir(file)); !os.IsNotExist(err) {
			t.Errorf("%s after the run: %v; want it removed", filepath.Dir(file), err)
		}
	}
}

// floorCgroups are the limit files of the cgroup floor (pid) makes, and
// the values the test gave it.
func floorCgroups(pid int) map[string]string {
	name := "agentrun-floor-" + strconv.Itoa(pid)
	var fs unix.Statfs_t
	if unix.Statfs("/sys/fs/cgroup", &fs) == nil && fs.Type == unix.CGROUP2_SUPER_MAGIC {
		d := filepath.Join("/sys/fs/cgroup", name)
		return map[string]string{filepath.Join(d, "memory.max"): "134217728", filepath.Join(d, "pids.max"): "33", filepath.Join(d, "cpu.max"): "50000 100000"}
	}
	return map[string]string{
		filepath.Join("/sys/fs/cgroup/memory", name, "memory.limit_in_bytes"): "134217728",
		filepath.Join("/sys/fs/cgroup/pids", name, "pids.max"):                "33",
		filepath.Join("/sys/fs/cgroup/cpu", name, "cpu.cfs_quota_us"):         "50000",
	}
}
