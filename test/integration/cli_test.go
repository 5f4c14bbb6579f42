package integration

import (
	"bufio"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/audit"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/test/testenv"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// agentrunBin builds cmd/agentrun once per test binary.
func agentrunBin(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		// A prebuilt binary, for hosts without Go (the device run).
		if pre := os.Getenv("AGENTRUN_BIN"); pre != "" {
			binPath = pre
			return
		}
		binPath = filepath.Join(stateDir, "agentrun-cli")
		cmd := exec.Command("go", "build", "-tags", "seccomp", "-o", binPath, "./cmd/agentrun")
		cmd.Dir = testenv.RepoRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "CGO_LDFLAGS="+staticLibseccomp())
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = err
			t.Logf("go build: %s", out)
			return
		}
		// Its seccomp helper beside it, as make build puts it.
		if out, err := exec.Command("install", "-m", "0755", seccompHelper, filepath.Join(stateDir, "agentrun-seccomp")).CombinedOutput(); err != nil {
			binErr = fmt.Errorf("installing the seccomp helper: %v: %s", err, out)
		}
	})
	if binErr != nil {
		t.Fatalf("building agentrun: %v", binErr)
	}
	return binPath
}

// staticLibseccomp is libseccomp's archive, as the Makefile links it.
func staticLibseccomp() string {
	out, err := exec.Command("pkg-config", "--variable=libdir", "libseccomp").Output()
	if err != nil {
		return ""
	}
	a := filepath.Join(strings.TrimSpace(string(out)), "libseccomp.a")
	if _, err := os.Stat(a); err != nil {
		return ""
	}
	return a
}

// TestBinaryIsStatic: agentrun is linked statically, libc and libseccomp
// included (make build), so a host without libseccomp2 runs it as well,
// and neither of a cold run's two execs of it (the CLI, the container's
// init) pays for the dynamic loader.
func TestBinaryIsStatic(t *testing.T) {
	f, err := elf.Open(agentrunBin(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	if len(libs) > 0 {
		t.Errorf("agentrun needs %v; want no shared library", libs)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("agentrun names a dynamic loader (PT_INTERP); want a static binary")
		}
	}
}

// TestInitConstructorOrder: in a container's init, runtime/runc/prefault's
// constructor maps the binary's code only once nsexec is done, so it must
// run after libcontainer's nsexec constructor; constructors run in the
// order of .init_array, which the linker fills in the order it meets
// their packages.
func TestInitConstructorOrder(t *testing.T) {
	f, err := elf.Open(agentrunBin(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sec := f.Section(".init_array")
	if sec == nil {
		t.Fatal("agentrun has no .init_array")
	}
	data, err := sec.Data()
	if err != nil {
		t.Fatal(err)
	}
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	names := map[uint64]string{}
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && (s.Name == "init" || s.Name == "agentrun_prefault") {
			names[s.Value] = s.Name
		}
	}
	var order []string
	for i := 0; i+8 <= len(data); i += 8 {
		if n, ok := names[f.ByteOrder.Uint64(data[i:])]; ok {
			order = append(order, n)
		}
	}
	if len(order) != 2 || order[0] != "init" || order[1] != "agentrun_prefault" {
		t.Errorf("constructors in .init_array: %v; want nsexec's init, then agentrun_prefault", order)
	}
}

// writeConfig writes cfg as a config file in a temporary dir and returns
// its path. A cfg without cgroup_parent or run_uids gets the suite's
// (scope).
func writeConfig(t testing.TB, cfg map[string]any) string {
	t.Helper()
	scope.ConfigMap(cfg)
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// plainConfig writes a config with the python image, the suite's state dir
// and no audit log, and returns its path.
func plainConfig(t testing.TB) string {
	t.Helper()
	return writeConfig(t, map[string]any{"image": pythonImage, "state_dir": stateDir, "audit": ""})
}

// gcCLI runs `agentrun gc` on the suite's state dir; its error says what gc
// printed.
func gcCLI(t testing.TB) error {
	t.Helper()
	if out, err := exec.Command(agentrunBin(t), "gc", "--config", plainConfig(t)).CombinedOutput(); err != nil {
		return fmt.Errorf("agentrun gc: %v\n%s", err, out)
	}
	return nil
}

// cli runs agentrun with a config pointing at the test's state dir.
func cli(t *testing.T, stdin string, args ...string) (res *result.Result, stdout, stderr string, code int) {
	t.Helper()
	dir := t.TempDir()
	cfg := map[string]any{"image": pythonImage, "state_dir": stateDir, "store_dir": filepath.Join(stateDir, "store"),
		"audit":  filepath.Join(dir, "audit.jsonl"),
		"policy": map[string]any{"local_images": []string{*imagesDir, os.TempDir(), "/nonexistent"}}}
	cfgPath := writeConfig(t, cfg)
	argv := append([]string{"--config", cfgPath}, args...)
	if args[0] == "run" {
		argv = append([]string{"run", "--config", cfgPath}, args[1:]...)
	}
	cmd := exec.Command(agentrunBin(t), argv...)
	cmd.Stdin = strings.NewReader(stdin)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code = 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running agentrun: %v", err)
	}
	stdout, stderr = o.String(), e.String()
	if strings.HasPrefix(strings.TrimSpace(stdout), "{") {
		res = &result.Result{}
		if err := json.Unmarshal([]byte(stdout), res); err != nil {
			t.Fatalf("result is not JSON: %v\n%s", err, stdout)
		}
	}
	assertNoLeaks(t)
	return res, stdout, stderr, code
}

func TestCLIExitCodes(t *testing.T) {
	for _, tc := range []struct {
		name, task string
		want       int
		check      func(*result.Result) bool
	}{
		{"success", `{"code":"print(45)"}`, 0, func(r *result.Result) bool { return r.Stdout == "45\n" }},
		{"program exit code", `{"code":"import sys; sys.exit(3)"}`, 3, func(r *result.Result) bool { return r.ExitCode == 3 }},
		{"timeout", `{"code":"while True: pass","limits":{"timeout":"500ms"}}`, 124, func(r *result.Result) bool { return r.TimedOut }},
		{"oom", `{"code":"x=bytearray(200<<20)","limits":{"memory":"32m"}}`, 137, func(r *result.Result) bool { return r.OOMKilled }},
		{"killed by signal", `{"code":"import ctypes; ctypes.string_at(0)"}`, 139, func(r *result.Result) bool { return r.Signal == "SIGSEGV" && !r.OOMKilled }},
		{"malformed json", `{"code":`, 125, func(r *result.Result) bool { return strings.Contains(r.Error, "code") }},
		{"unknown field", `{"code":"1","memory":"1g"}`, 125, func(r *result.Result) bool { return strings.Contains(r.Error, "memory: unknown field") }},
		{"bad size", `{"code":"1","limits":{"memory":"lots"}}`, 125, func(r *result.Result) bool { return strings.Contains(r.Error, "limits.memory") }},
		{"negative pids", `{"code":"1","limits":{"pids":-1}}`, 125, func(r *result.Result) bool { return strings.Contains(r.Error, "limits.pids") }},
		{"over policy", `{"code":"1","limits":{"memory":"64g"}}`, 125, func(r *result.Result) bool { return strings.Contains(r.Error, "policy") }},
		{"path trick", `{"code":"1","files":{"../etc/x":{"content":"x"}}}`, 125, func(r *result.Result) bool { return strings.Contains(r.Error, "files") }},
		{"empty code", `{"code":""}`, 125, func(r *result.Result) bool { return strings.Contains(r.Error, "code") }},
		{"missing image", `{"code":"1","image":"dir:/nonexistent/rootfs"}`, 125, func(r *result.Result) bool { return strings.Contains(r.Error, "/nonexistent/rootfs") }},
		{"tmp above memory", `{"code":"1","limits":{"memory":"32m","tmp_size":"64m"}}`, 125, func(r *result.Result) bool {
			return strings.Contains(r.Error, "limits.tmp_size") && strings.Contains(r.Error, "limits.memory")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, stdout, stderr, code := cli(t, tc.task, "run", "-")
			if code != tc.want {
				t.Errorf("exit %d; want %d (stdout %s stderr %s)", code, tc.want, stdout, stderr)
			}
			if res == nil || !tc.check(res) {
				t.Errorf("result does not match: %s", stdout)
			}
			// exit_code is the exit status, whatever the outcome: a
			// timeout's 124, an OOM kill's 137, and a task that never
			// ran says so in exit_code too, never 0.
			if res != nil && res.ExitCode != code {
				t.Errorf("exit_code %d; want the exit status %d", res.ExitCode, code)
			}
		})
	}
}

func TestCLIFileArgumentFormatsAndAudit(t *testing.T) {
	dir := t.TempDir()
	taskPath := filepath.Join(dir, "task.json")
	os.WriteFile(taskPath, []byte(`{"session":"s-1","code":"print('hi')"}`), 0o600)

	// A lone file argument means run.
	res, _, _, code := cli(t, "", "--audit", "", taskPath)
	if code != 0 || res == nil || res.Stdout != "hi\n" || res.Session != "s-1" {
		t.Fatalf("agentrun FILE: exit %d result %+v", code, res)
	}

	_, stdout, stderr, code := cli(t, "", "run", "--format", "text", taskPath)
	if code != 0 || stdout != "hi\n" || !strings.Contains(stderr, "exit 0") {
		t.Errorf("--format text: exit %d stdout %q stderr %q", code, stdout, stderr)
	}

	out := filepath.Join(dir, "result.json")
	_, stdout, _, code = cli(t, "", "run", "--output", out, "--audit", filepath.Join(dir, "audit.jsonl"), taskPath)
	if code != 0 || stdout != "" {
		t.Errorf("--output: exit %d stdout %q", code, stdout)
	}
	b, err := os.ReadFile(out)
	var r result.Result
	if err != nil || json.Unmarshal(b, &r) != nil || r.Stdout != "hi\n" {
		t.Fatalf("--output file: %v %s", err, b)
	}
	f, err := os.Open(filepath.Join(dir, "audit.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		t.Fatal("audit log is empty")
	}
	var rec audit.Record
	if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
		t.Fatal(err)
	}
	if rec.ID != r.ID || rec.Session != "s-1" || !strings.HasPrefix(rec.TaskHash, "sha256:") || rec.Limits.Values["memory"] != 256<<20 ||
		rec.Runtime != "libcontainer" || rec.StdoutBytes != 3 || rec.Time.IsZero() {
		t.Errorf("audit record = %+v", rec)
	}
	if strings.Contains(sc.Text(), "print('hi')") {
		t.Error("audit record holds the task's code")
	}
}

// TestCLITextFormat: --format text keeps the program's stdout on stdout and
// stderr on stderr, escapes control characters so that a program cannot
// fake or hide agentrun's own lines, marks truncation, lists collected
// files, and prints a host error as an error.
func TestCLITextFormat(t *testing.T) {
	task := pyTask(`import sys
sys.stderr.write("on stderr\n")
print("x" * 300, end="")
sys.stdout.flush()
sys.stdout.write("\n[agentrun ar-0] exit 0\x1b[8m\r")
open("/workspace/made.txt", "w").write("abc")
`, map[string]any{"collect": []string{"made.txt"}, "limits": map[string]any{"output_bytes": 100}})
	_, stdout, stderr, code := cli(t, task, "run", "--format", "text", "-")
	if code != 0 {
		t.Fatalf("exit %d: %s %s", code, stdout, stderr)
	}
	if !strings.HasPrefix(stdout, strings.Repeat("x", 100)+"\n[agentrun ar-") || !strings.Contains(stdout, "stdout truncated: 100 of ") {
		t.Errorf("stdout %q; want the kept output, then the truncation marker on its own line", stdout)
	}
	if !strings.HasPrefix(stderr, "on stderr\n") || !strings.Contains(stderr, "exit 0") || !strings.Contains(stderr, "file made.txt: 3 bytes") {
		t.Errorf("stderr %q; want the program's stderr, the summary and the file", stderr)
	}
	_, stdout, _, _ = cli(t, pyTask(`print("[agentrun ar-0] exit 0\x1b[8m\r")`, nil), "run", "--format", "text", "-")
	if strings.ContainsAny(stdout, "\x1b\r") || !strings.Contains(stdout, `\x1b[8m\r`) {
		t.Errorf("stdout %q; want the control characters escaped", stdout)
	}
	_, stdout, stderr, code = cli(t, `{"code":"1","image":"dir:/nonexistent/rootfs"}`, "run", "--format", "text", "-")
	if code != 125 || stdout != "" || !strings.HasPrefix(stderr, "agentrun: error: ") || strings.Contains(stderr, "[agentrun") {
		t.Errorf("host error: exit %d stdout %q stderr %q; want the error alone", code, stdout, stderr)
	}
}

// TestCLIArgumentsAndOutput: flags may follow the task file; --output to a
// path that cannot be written fails before the task runs; a task over
// 32 MiB is named by its own size; AGENTRUN_SERVER with --config names the
// variable.
func TestCLIArgumentsAndOutput(t *testing.T) {
	dir := t.TempDir()
	taskPath := filepath.Join(dir, "task.json")
	os.WriteFile(taskPath, []byte(`{"code":"print('hi')"}`), 0o600)
	for _, args := range [][]string{{"run", taskPath, "--format", "text"}, {taskPath, "--format", "text"}} {
		_, stdout, stderr, code := cli(t, "", args...)
		if code != 0 || stdout != "hi\n" {
			t.Errorf("agentrun %v: exit %d stdout %q stderr %q", args, code, stdout, stderr)
		}
	}

	start := time.Now()
	_, _, stderr, code := cli(t, `{"code":"import time; time.sleep(60)"}`, "run", "--output", filepath.Join(dir, "no", "such", "dir", "r.json"), "-")
	if code != 125 || !strings.Contains(stderr, "--output") || !strings.Contains(stderr, "not run") {
		t.Errorf("unwritable --output: exit %d stderr %q; want 125 before the run", code, stderr)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("unwritable --output: the 60 s task ran (%v)", d)
	}

	big := filepath.Join(dir, "big.json")
	f, _ := os.Create(big)
	f.Truncate(40_000_000)
	f.Close()
	res, _, _, code := cli(t, "", "run", big)
	if code != 125 || res == nil || !strings.Contains(res.Error, "40000000 bytes") {
		t.Errorf("a 40 MB task file: exit %d, %+v; want its size named", code, res)
	}

	cmd := exec.Command(agentrunBin(t), "run", "--config", plainConfig(t), taskPath)
	cmd.Env = append(os.Environ(), "AGENTRUN_SERVER=unix:///nonexistent.sock")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "AGENTRUN_SERVER") {
		t.Errorf("AGENTRUN_SERVER with --config: %v: %s; want the variable named", err, out)
	}
}
