package integration

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/image/imagetest"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/task"
)

// cliRun is what one agentrun invocation gave back.
type cliRun struct {
	res            *result.Result // the JSON result on stdout, nil if there was none
	stdout, stderr string
	code           int
	took           time.Duration
	maxRSS         int64 // bytes, agentrun's peak resident set
}

// badConfig is a config like cli()'s, pointing at the test's state dir,
// with overrides merged over its top-level keys.
func badConfig(t *testing.T, over map[string]any) []byte {
	t.Helper()
	cfg := map[string]any{"image": pythonImage, "state_dir": stateDir, "store_dir": filepath.Join(stateDir, "store"),
		"audit": filepath.Join(t.TempDir(), "audit.jsonl"), "runsc": map[string]any{"path": runscPath, "flags": []string{}},
		// The local images tasks may name: the test images, temporary
		// dirs, and the paths the image cases below probe.
		"policy": map[string]any{"local_images": []string{*imagesDir, os.TempDir(), "/nonexistent", "/etc"}}}
	maps.Copy(cfg, over)
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// runCLI runs the agentrun binary with the config file content cfg, in
// the working directory dir ("" for a fresh one), with stdin, and args
// after the command word and --config.
func runCLI(t *testing.T, cfg []byte, dir string, stdin io.Reader, command string, args ...string) cliRun {
	t.Helper()
	bin := agentrunBin(t)
	if dir == "" {
		dir = t.TempDir()
	}
	cfgPath := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(cfgPath, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{command, "--config", cfgPath}, args...)...)
	cmd.Dir = dir
	cmd.Stdin = stdin
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	start := time.Now()
	err := cmd.Run()
	out := cliRun{stdout: o.String(), stderr: e.String(), took: time.Since(start)}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		out.maxRSS = ru.Maxrss << 10
	}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		out.code = ee.ExitCode()
		if ee.ExitCode() < 0 {
			t.Fatalf("agentrun died: %v\nstderr: %s", err, out.stderr)
		}
	case err != nil && !errors.Is(err, syscall.EPIPE):
		t.Fatalf("running agentrun: %v", err)
	}
	if strings.Contains(out.stderr, "panic:") || strings.Contains(out.stderr, "goroutine ") {
		t.Errorf("agentrun crashed:\n%s", out.stderr)
	}
	if strings.HasPrefix(strings.TrimSpace(out.stdout), "{") {
		out.res = &result.Result{}
		if err := json.Unmarshal(o.Bytes(), out.res); err != nil {
			t.Errorf("result is not JSON: %v\n%s", err, out.stdout)
			out.res = nil
		}
	}
	return out
}

// runCLIPlain runs agentrun with args and returns its stdout, failing the
// test unless it exits 0.
func runCLIPlain(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(agentrunBin(t), args...).Output()
	if err != nil {
		t.Fatalf("agentrun %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}

// badInput is one hostile input: a task, a config, or both.
type badInput struct {
	name   string
	task   string         // the task JSON
	asFile bool           // pass the task as a file argument instead of on stdin
	cfg    map[string]any // merged over badConfig's keys
	rawCfg string         // the config file's whole content, instead of badConfig
	want   string         // what the error must say
	limit  time.Duration  // how long it may take (default 10s)
}

func badInputs(canary string) []badInput {
	long := strings.Repeat("a", 300)
	big := `{"code":"print(1)","stdin":"` + strings.Repeat("A", 40<<20) + `"}`
	deepArrays := strings.Repeat("[", 100000) + strings.Repeat("]", 100000)
	deepFiles := `{"code":"1","files":{"a":` + strings.Repeat(`{"content":`, 100000) + `"x"` + strings.Repeat("}", 100000) + `}}`
	deepCommand := `{"command":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}`
	withCode := func(extra string) string { return `{"code":"print(1)",` + extra + `}` }
	cases := []badInput{
		// Syntax and size.
		{name: "malformed json", task: `{"code":`, want: "invalid JSON"},
		{name: "not an object", task: `"print(1)"`, want: "expected an object"},
		{name: "trailing data", task: `{"code":"1"} {"code":"2"}`, want: "unexpected data after"},
		{name: "duplicate key", task: `{"code":"1","code":"2"}`, want: "code: duplicate key"},
		{name: "40 MiB task on stdin", task: big, want: fmt.Sprintf("more than the maximum %d", task.MaxTaskBytes)},
		{name: "40 MiB task file", task: big, asFile: true, want: fmt.Sprintf("more than the maximum %d", task.MaxTaskBytes)},
		{name: "deeply nested arrays", task: deepArrays, want: "expected an object, got an array"},
		{name: "deeply nested objects in files", task: deepFiles, want: `files["a"].content: expected a string, got an object`},
		{name: "deeply nested arrays in command", task: deepCommand, want: "command[0]: expected a string, got an array"},
		// Unknown fields and wrong types.
		{name: "unknown top-level field", task: withCode(`"memory":"1g"`), want: "task: memory: unknown field"},
		{name: "unknown field in limits", task: withCode(`"limits":{"memroy":"1g"}`), want: "task: limits.memroy: unknown field"},
		{name: "unknown field in a file", task: withCode(`"files":{"a":{"content":"x","mode":"0777"}}`), want: `task: files["a"].mode: unknown field`},
		{name: "case-folded field", task: `{"Code":"print(1)"}`, want: "task: Code: unknown field"},
		{name: "code as number", task: `{"code":1}`, want: "code: expected a string, got a number"},
		{name: "command as string", task: `{"command":"rm -rf /"}`, want: "command: expected an array, got a string"},
		{name: "limits.pids as string", task: withCode(`"limits":{"pids":"64"}`), want: "limits.pids: expected an integer, got a string"},
		{name: "files as list", task: withCode(`"files":["a"]`), want: "files: expected an object, got an array"},
		{name: "env as list", task: withCode(`"env":["A=1"]`), want: "env: expected an object, got an array"},
		// Absurd limits.
		{name: "timeout 1000h", task: withCode(`"limits":{"timeout":"1000h"}`), want: "limits.timeout: 1000h exceeds policy maximum"},
		{name: "timeout negative", task: withCode(`"limits":{"timeout":"-5s"}`), want: "limits.timeout"},
		{name: "timeout zero", task: withCode(`"limits":{"timeout":"0s"}`), want: "limits.timeout"},
		{name: "memory 1e30", task: withCode(`"limits":{"memory":"1e30"}`), want: "limits.memory"},
		{name: "memory past int64", task: withCode(`"limits":{"memory":"9223372036854775808"}`), want: "limits.memory"},
		{name: "memory 1 byte", task: withCode(`"limits":{"memory":"1"}`), want: "limits.memory"},
		{name: "pids 1e12", task: withCode(`"limits":{"pids":1e12}`), want: "limits.pids"},
		{name: "pids 10^12", task: withCode(`"limits":{"pids":1000000000000}`), want: "limits.pids: 1000000000000 exceeds policy maximum"},
		{name: "pids past int64", task: withCode(`"limits":{"pids":99999999999999999999}`), want: "limits.pids"},
		{name: "cpus -1", task: withCode(`"limits":{"cpus":-1}`), want: "limits.cpus: -1 must be greater than zero"},
		{name: "cpus 1e309", task: withCode(`"limits":{"cpus":1e309}`), want: "limits.cpus"},
		{name: "output_bytes 0", task: withCode(`"limits":{"output_bytes":0}`), want: "limits.output_bytes"},
		{name: "tmp_size 0", task: withCode(`"limits":{"tmp_size":"0"}`), want: "limits.tmp_size"},
		{name: "workspace smaller than files", task: withCode(`"limits":{"workspace_size":"1k"},"files":{"a":{"content":"` + strings.Repeat("x", 2048) + `"}}`), want: "limits.workspace_size"},
		// Hostile file names.
		{name: "file ../x", task: withCode(`"files":{"../x":{"content":"x"}}`), want: `files["../x"]: must not contain a ".." component`},
		{name: "file /etc/x", task: withCode(`"files":{"/etc/x":{"content":"x"}}`), want: `files["/etc/x"]: must be relative`},
		{name: "file a/../../x", task: withCode(`"files":{"a/../../x":{"content":"x"}}`), want: `files["a/../../x"]: must not contain a ".." component`},
		{name: "file with NUL", task: withCode(`"files":{"a\u0000b":{"content":"x"}}`), want: `files["a\x00b"]: contains NUL`},
		{name: "file 300-byte component", task: withCode(`"files":{"` + long + `":{"content":"x"}}`), want: "has a component longer than 255 bytes"},
		{name: "file empty name", task: withCode(`"files":{"":{"content":"x"}}`), want: `files[""]: must not be empty`},
		{name: "file .", task: withCode(`"files":{".":{"content":"x"}}`), want: `files["."]: must not contain a "." component`},
		{name: "file a//b", task: withCode(`"files":{"a//b":{"content":"x"}}`), want: `files["a//b"]: has an empty path component`},
		{name: "file into canary, absolute", task: withCode(`"files":{"` + canary + `/x":{"content":"x"}}`), want: "must be relative"},
		{name: "file into canary, dotdot", task: withCode(`"files":{"` + strings.Repeat("../", 12) + canary[1:] + `/x":{"content":"x"}}`), want: `must not contain a ".." component`},
		{name: "file both contents", task: withCode(`"files":{"a":{"content":"x","content_base64":"eA=="}}`), want: "exactly one of content or content_base64"},
		{name: "file bad base64", task: withCode(`"files":{"a":{"content_base64":"!!!"}}`), want: `files["a"].content_base64: invalid base64`},
		{name: "file over the code file", task: withCode(`"files":{"main.py":{"content":"x"}}`), want: "collides with the code file"},
		{name: "file under a file", task: withCode(`"files":{"a":{"content":"x"},"a/b":{"content":"y"}}`), want: "cannot also be a directory"},
		// Environment.
		{name: "env name with =", task: withCode(`"env":{"A=B":"x"}`), want: `env["A=B"]: invalid variable name`},
		{name: "env name with NUL", task: withCode(`"env":{"A\u0000B":"x"}`), want: "invalid variable name"},
		{name: "env value with NUL", task: withCode(`"env":{"A":"x\u0000y"}`), want: `env["A"]: value contains NUL`},
		{name: "env PATH", task: withCode(`"env":{"PATH":"/tmp"}`), want: "PATH is reserved"},
		{name: "env HTTP_PROXY", task: withCode(`"env":{"HTTP_PROXY":"http://evil:1"}`), want: "HTTP_PROXY is reserved"},
		{name: "env https_proxy", task: withCode(`"env":{"https_proxy":"http://evil:1"}`), want: "https_proxy is reserved"},
		{name: "env AGENTRUN_X", task: withCode(`"env":{"AGENTRUN_X":"1"}`), want: "AGENTRUN_X is reserved"},
		// Collect.
		{name: "collect ../*", task: withCode(`"collect":["../*"]`), want: `collect[0]: must not contain a ".." component`},
		{name: "collect out/../../x", task: withCode(`"collect":["ok","out/../../x"]`), want: `collect[1]: must not contain a ".." component`},
		{name: "collect canary", task: withCode(`"collect":["` + strings.Repeat("../", 12) + canary[1:] + `/*"]`), want: "collect[0]"},
		{name: "collect absolute", task: withCode(`"collect":["/etc/passwd"]`), want: "collect[0]: must be relative"},
		{name: "collect bad glob", task: withCode(`"collect":["["]`), want: "collect[0]: invalid glob"},
		// Other fields.
		{name: "session path", task: withCode(`"session":"../../etc"`), want: "session"},
		{name: "command with NUL", task: `{"command":["echo","a\u0000b"]}`, want: "command[1]"},
		{name: "code and command", task: `{"code":"1","command":["true"]}`, want: "mutually exclusive"},
		{name: "no code", task: `{"stdin":"x"}`, want: "one of code or command is required"},
		{name: "unknown language", task: withCode(`"language":"cobol"`), want: `language: unknown language "cobol"`},
		// Images.
		{name: "image with spaces", task: withCode(`"image":"bad ref with spaces"`), want: "contains whitespace"},
		{name: "image too long", task: withCode(`"image":"` + strings.Repeat("a", 2000) + `"`), want: "image: longer than"},
		{name: "image dir:relative", task: withCode(`"image":"dir:relative"`), want: "dir:relative"},
		{name: "image dir:/nonexistent", task: withCode(`"image":"dir:/nonexistent"`), want: "image not found: dir:/nonexistent"},
		{name: "image dir: a file", task: withCode(`"image":"dir:/etc/hostname"`), want: "not a directory"},
		{name: "image outside policy", task: withCode(`"image":"dir:/usr"`), want: "policy.local_images"},
		{name: "image oci:/nonexistent:tag", task: withCode(`"image":"oci:/nonexistent:tag"`), want: "no OCI layout at /nonexistent"},
		{name: "image oci: empty tag", task: withCode(`"image":"oci:/nonexistent:"`), want: "empty tag"},
		{name: "image docker-archive:/nonexistent/image.tar", task: withCode(`"image":"docker-archive:/nonexistent/image.tar"`), want: "image not found"},
		{name: "image unreachable registry", task: withCode(`"image":"127.0.0.1:1/x:y"`), want: "registry unreachable", limit: 15 * time.Second,
			cfg: map[string]any{"policy": map[string]any{"registries": []string{"127.0.0.1:1"}}}},
		{name: "image registry not in policy", task: withCode(`"image":"127.0.0.1:1/x:y"`), want: `registry 127.0.0.1:1 is not in the config's policy.registries`},
		{name: "image a bare path", task: withCode(`"image":"/srv/rootfs"`), want: "a path is not an image reference; use dir:/path/to/rootfs"},
		{name: "image bad remote ref", task: withCode(`"image":"UPPER/Case:tag"`), want: "bad image reference"},
		// Runtime and network.
		{name: "runtime docker", task: withCode(`"runtime":"docker"`), want: `runtime: "docker" is not a runtime`},
		{name: "allow IP literal", task: withCode(`"network":{"allow":["1.2.3.4"]}`), want: "network.allow[0]"},
		{name: "allow *", task: withCode(`"network":{"allow":["*"]}`), want: `network.allow[0]: "*": a wildcard is only allowed`},
		{name: "allow URL", task: withCode(`"network":{"allow":["https://pypi.org"]}`), want: `network.allow[0]: "https://pypi.org": a URL, not a host name: give the host name alone ("pypi.org")`},
		{name: "allow inner wildcard", task: withCode(`"network":{"allow":["a.*.com"]}`), want: "network.allow[0]"},
		{name: "allow bad port", task: withCode(`"network":{"allow":["ok.test","ok.test:99999"]}`), want: "network.allow[1]"},
		{name: "allow under a no-network policy", task: withCode(`"network":{"allow":["ok.test"]}`),
			cfg: map[string]any{"policy": map[string]any{"allow_network": false}}, want: "network access is not allowed by policy"},
		// Config files.
		{name: "config unknown key", task: `{"code":"print(1)"}`, rawCfg: `{"state_dir":"` + stateDir + `","bogus":1}`, want: `unknown field "bogus"`},
		{name: "config unknown nested key", task: `{"code":"print(1)"}`, rawCfg: `{"state_dir":"` + stateDir + `","policy":{"memroy":"1g"}}`, want: `unknown field "policy.memroy"`},
		{name: "config malformed", task: `{"code":"print(1)"}`, rawCfg: `{"state_dir":`, want: "invalid JSON"},
		{name: "config empty image", task: `{"code":"print(1)"}`, cfg: map[string]any{"image": ""}, want: "image: image is required"},
		{name: "config relative state_dir", task: `{"code":"print(1)"}`, cfg: map[string]any{"state_dir": "run/agentrun"}, want: "state_dir"},
	}
	return cases
}

// TestBadInputMatrix feeds agentrun's CLI hostile tasks and configs. Each
// must exit 125 with a JSON result whose error names the problem, start
// nothing and leave the host as it was.
func TestBadInputMatrix(t *testing.T) {
	primeStateDir(t)
	canary := makeCanary(t)
	_, etcXErr := os.Lstat("/etc/x")

	for _, tc := range badInputs(canary) {
		t.Run(tc.name, func(t *testing.T) {
			cfg := []byte(tc.rawCfg)
			if tc.rawCfg == "" {
				cfg = badConfig(t, tc.cfg)
			}
			args, stdin := []string{"-"}, io.Reader(strings.NewReader(tc.task))
			if tc.asFile {
				p := filepath.Join(t.TempDir(), "task.json")
				if err := os.WriteFile(p, []byte(tc.task), 0o600); err != nil {
					t.Fatal(err)
				}
				args, stdin = []string{p}, nil
			}
			checkRefused(t, tc.want, tc.limit, canary, func() cliRun { return runCLI(t, cfg, "", stdin, "run", args...) })
		})
	}

	for _, tc := range []struct {
		name              string
		prepare, noInodes bool
		want              string
	}{
		{"full state_dir/fresh", false, true, "creating state dir: mkdir"},
		{"full state_dir/no inodes", true, true, "creating run dir: mkdir"},
		{"full state_dir/no blocks", true, false, "no space left on device"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fsDir := fullTmpfs(t, tc.prepare, tc.noInodes)
			before := treeState(t, fsDir, true)
			cfg := badConfig(t, map[string]any{"state_dir": filepath.Join(fsDir, "state")})
			checkRefused(t, tc.want, 0, canary, func() cliRun { return runCLI(t, cfg, "", strings.NewReader(`{"code":"print(1)"}`), "run", "-") })
			if diff := treeDiff(before, treeState(t, fsDir, true)); len(diff) > 0 {
				t.Errorf("the full state dir changed:\n  %s", strings.Join(diff, "\n  "))
			}
			if m := mountsUnder(fsDir); len(m) > 0 {
				t.Errorf("mounts left under the full state dir:\n  %s", strings.Join(m, "\n  "))
			}
			if p := procsMentioning(fsDir); len(p) > 0 {
				t.Errorf("processes left that mention %s:\n  %s", fsDir, strings.Join(p, "\n  "))
			}
		})
	}

	if _, err := os.Lstat("/etc/x"); (err == nil) != (etcXErr == nil) {
		t.Errorf("/etc/x appeared or vanished during the matrix (before: %v, after: %v)", etcXErr, err)
	}
}

var (
	primeOnce sync.Once
	primeErr  string
)

// primeStateDir makes the state dir's skeleton (runs/, runc/, runsc/, the
// store, the lock files a first run creates) with one good run per
// runtime and one lookup in the store, so that anything new after a case
// is that case's doing.
func primeStateDir(t *testing.T) {
	t.Helper()
	primeOnce.Do(func() {
		primeErr = "priming did not finish"
		for _, rt := range runtimes {
			out := runCLI(t, badConfig(t, nil), "", strings.NewReader(`{"code":"print('primed')","runtime":"`+rt+`"}`), "run", "-")
			if out.code != 0 || out.res == nil || out.res.Stdout != "primed\n" {
				primeErr = fmt.Sprintf("priming the state dir on %s: exit %d\n%s\n%s", rt, out.code, out.stdout, out.stderr)
				return
			}
		}
		// The store's index lock, which its first lookup creates.
		out := runCLI(t, badConfig(t, nil), "", strings.NewReader(`{"code":"1","image":"oci:/nonexistent/agentrun-prime:x"}`), "run", "-")
		if out.code != result.ExitSetup {
			primeErr = fmt.Sprintf("priming the store: exit %d\n%s\n%s", out.code, out.stdout, out.stderr)
			return
		}
		primeErr = ""
	})
	if primeErr != "" {
		t.Fatal(primeErr)
	}
}

// checkRefused runs fn and checks that agentrun refused it with exit 125
// and an error containing want, within limit, and that nothing was
// started: no host leak, no new entry in the state dir, no process left,
// the canary untouched.
func checkRefused(t *testing.T, want string, limit time.Duration, canary string, fn func() cliRun) {
	t.Helper()
	if limit == 0 {
		limit = 10 * time.Second
	}
	stateBefore := treeState(t, stateDir, false)
	canaryBefore := treeState(t, canary, true)
	out := fn()
	if out.code != result.ExitSetup {
		t.Errorf("exit %d; want %d\nstdout: %.2000s\nstderr: %.2000s", out.code, result.ExitSetup, out.stdout, out.stderr)
	}
	switch {
	case out.res == nil:
		t.Errorf("no JSON result on stdout: %.2000q", out.stdout)
	case !strings.Contains(out.res.Error, want):
		t.Errorf("error %.2000q; want it to contain %q", out.res.Error, want)
	case !strings.Contains(out.stderr, want):
		t.Errorf("stderr %.2000q; want it to contain %q", out.stderr, want)
	}
	if out.res != nil && (out.res.Stdout != "" || out.res.Stderr != "" || out.res.DurationMS != 0) {
		t.Errorf("a program ran: stdout %q stderr %q duration %d ms", out.res.Stdout, out.res.Stderr, out.res.DurationMS)
	}
	if out.took > limit {
		t.Errorf("took %v; want at most %v", out.took, limit)
	}
	assertNoLeaks(t)
	if diff := treeDiff(stateBefore, treeState(t, stateDir, false)); len(diff) > 0 {
		t.Errorf("the state dir changed:\n  %s", strings.Join(diff, "\n  "))
	}
	if diff := treeDiff(canaryBefore, treeState(t, canary, true)); len(diff) > 0 {
		t.Errorf("the canary changed:\n  %s", strings.Join(diff, "\n  "))
	}
	if p := procsMentioning(stateDir); len(p) > 0 {
		t.Errorf("processes left that mention %s:\n  %s", stateDir, strings.Join(p, "\n  "))
	}
}

// makeCanary makes a directory tree a hostile task might aim at, whose
// bytes must never change.
func makeCanary(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "canary")
	for name, data := range map[string]string{"x": "canary x\n", "sub/secret": "do not touch\n", "sub/deeper/y": "y\n"} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("sub/secret", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// treeState describes every entry under root by its relative path: type
// and mode, and with content also size, mtime and the bytes' sha256 (or a
// link's target).
func treeState(t testing.TB, root string, content bool) map[string]string {
	t.Helper()
	state := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while walking: the diff shows it
			}
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if m, _ := filepath.Match("store/locks/ref-??.lock", rel); m {
			// The store's pull locks: at most 256, shared by all references.
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		desc := fi.Mode().String()
		if content && !fi.IsDir() {
			// A directory's mtime moves when an entry comes and goes
			// again; its entries are compared one by one instead.
			desc += fmt.Sprintf(" %d %d", fi.Size(), fi.ModTime().UnixNano())
			switch {
			case fi.Mode().IsRegular():
				b, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				sum := sha256.Sum256(b)
				desc += " " + hex.EncodeToString(sum[:])
			case fi.Mode()&fs.ModeSymlink != 0:
				target, _ := os.Readlink(p)
				desc += " -> " + target
			}
		}
		state[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatalf("walking %s: %v", root, err)
	}
	return state
}

// treeDiff lists what differs between two treeStates.
func treeDiff(before, after map[string]string) []string {
	var diff []string
	for _, p := range slices.Sorted(maps.Keys(after)) {
		switch b, ok := before[p]; {
		case !ok:
			diff = append(diff, "new: "+p+" "+after[p])
		case b != after[p]:
			diff = append(diff, "changed: "+p+" "+b+" => "+after[p])
		}
	}
	for _, p := range slices.Sorted(maps.Keys(before)) {
		if _, ok := after[p]; !ok {
			diff = append(diff, "gone: "+p)
		}
	}
	return diff
}

// mountsUnder lists mounts strictly below dir.
func mountsUnder(dir string) []string {
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, line)
		}
	}
	return out
}

// fullTmpfs mounts a 64 KiB tmpfs (unmounted at Cleanup) and fills it:
// every block, and with noInodes every inode too. With prepare, a run
// first uses state_dir DIR/state there, so that its skeleton exists and
// the failure comes later in the run's setup. It returns the mount point.
func fullTmpfs(t *testing.T, prepare, noInodes bool) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "fs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=64k,nr_inodes=64,mode=0755"); err != nil {
		t.Fatalf("mounting a tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
	if prepare {
		out := runCLI(t, badConfig(t, map[string]any{"state_dir": filepath.Join(dir, "state")}), "", strings.NewReader(`{"code":"print('ok')"}`), "run", "-")
		if out.code != 0 || out.res == nil || out.res.Stdout != "ok\n" {
			t.Fatalf("preparing the state dir: exit %d\n%s\n%s", out.code, out.stdout, out.stderr)
		}
	}
	f, err := os.Create(filepath.Join(dir, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatalf("filling the tmpfs: %v", err)
			}
			break
		}
	}
	f.Close()
	if noInodes {
		for i := 0; ; i++ {
			f, err := os.Create(filepath.Join(dir, fmt.Sprintf("inode-%d", i)))
			if err != nil {
				if !errors.Is(err, unix.ENOSPC) {
					t.Fatalf("filling the tmpfs's inodes: %v", err)
				}
				break
			}
			f.Close()
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Bavail != 0 || (noInodes && st.Ffree != 0) {
		t.Fatalf("tmpfs not full: %d blocks, %d inodes free", st.Bavail, st.Ffree)
	}
	return dir
}

// TestBadInputHostDirImage: a task may not make a host directory of its
// choosing its root filesystem: neither the host's / (every world-readable
// host file would be visible to the sandbox) nor a path relative to
// wherever agentrun happens to run.
func TestBadInputHostDirImage(t *testing.T) {
	primeStateDir(t)
	canary := makeCanary(t)
	t.Run("dir:/", func(t *testing.T) {
		cfg := badConfig(t, nil)
		checkRefused(t, "image", 0, canary, func() cliRun {
			return runCLI(t, cfg, "", strings.NewReader(`{"command":["cat","/etc/hostname"],"image":"dir:/"}`), "run", "-")
		})
	})
	t.Run("dir:relative", func(t *testing.T) {
		// agentrun's working directory holds a usable root filesystem
		// named "relative".
		cwd := t.TempDir()
		src := strings.TrimPrefix(busyboxImage, "dir:")
		if out, err := exec.Command("cp", "-a", src, filepath.Join(cwd, "relative")).CombinedOutput(); err != nil {
			t.Fatalf("copying the busybox rootfs: %v\n%s", err, out)
		}
		cfg := badConfig(t, nil)
		checkRefused(t, "dir:relative", 0, canary, func() cliRun {
			return runCLI(t, cfg, cwd, strings.NewReader(`{"command":["echo","ran in a cwd-relative rootfs"],"image":"dir:relative"}`), "run", "-")
		})
	})
}

// TestBadInputCorruptStore damages a pulled image's store entry in several
// ways and runs a task with that image. Each must end in a clean 125 or a
// successful run on an intact rootfs (re-pulled or still verified), never
// a crash or a run on a broken tree. What happens for each is logged.
func TestBadInputCorruptStore(t *testing.T) {
	layout := filepath.Join(t.TempDir(), "layout")
	digest := imagetest.WriteLayout(t, layout, "v1", strings.TrimPrefix(busyboxImage, "dir:"))
	ref := "oci:" + layout + ":v1"
	taskJSON := fmt.Sprintf(`{"image":%q,"command":["sh","-c","echo ok; test -x /bin/busybox"]}`, ref)

	// pulled makes a store holding ref: pulled with `agentrun pull` where
	// this agentrun has it, else by a run of the image; either way a run of
	// it then works.
	help := runCLIPlain(t, "help")
	hasPull := strings.Contains(help, "\n  pull ")
	pulled := func(t *testing.T) (cfg []byte, store string) {
		store = filepath.Join(t.TempDir(), "store")
		cfg = badConfig(t, map[string]any{"store_dir": store})
		if hasPull {
			out := runCLI(t, cfg, "", nil, "pull", ref)
			if out.code != 0 || !strings.Contains(out.stdout, digest) {
				t.Fatalf("agentrun pull: exit %d\n%s\n%s", out.code, out.stdout, out.stderr)
			}
		}
		out := runCLI(t, cfg, "", strings.NewReader(taskJSON), "run", "-")
		if out.code != 0 || out.res == nil || out.res.Stdout != "ok\n" || out.res.ImageDigest != digest {
			t.Fatalf("first run: exit %d\n%s\n%s", out.code, out.stdout, out.stderr)
		}
		assertNoLeaks(t)
		return cfg, store
	}
	t.Logf("store filled with agentrun pull: %v", hasPull)
	layerBlob := func(t *testing.T, store string) string {
		t.Helper()
		// The only blob of the single layer is the largest one.
		var biggest string
		var size int64 = -1
		entries, err := os.ReadDir(filepath.Join(store, "blobs", "sha256"))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			fi, err := e.Info()
			if err == nil && fi.Size() > size {
				biggest, size = filepath.Join(store, "blobs", "sha256", e.Name()), fi.Size()
			}
		}
		if biggest == "" {
			t.Fatal("no blobs in the store")
		}
		return biggest
	}
	rootfsOf := func(store string) string {
		return filepath.Join(store, "rootfs", "sha256", strings.TrimPrefix(digest, "sha256:"))
	}

	for _, tc := range []struct {
		name    string
		corrupt func(t *testing.T, store string)
		want125 string // if it fails, the error must contain this
	}{
		{"refs.json garbage", func(t *testing.T, store string) {
			os.WriteFile(filepath.Join(store, "refs.json"), []byte("{not json"), 0o600)
		}, "refs.json"},
		{"refs.json empty", func(t *testing.T, store string) {
			os.WriteFile(filepath.Join(store, "refs.json"), nil, 0o600)
		}, "refs.json"},
		{"refs.json names a missing digest", func(t *testing.T, store string) {
			p := filepath.Join(store, "refs.json")
			b, _ := os.ReadFile(p)
			bogus := "sha256:" + strings.Repeat("0", 64)
			os.WriteFile(p, bytes.ReplaceAll(b, []byte(`"digest": "`+digest+`"`), []byte(`"digest": "`+bogus+`"`)), 0o600)
		}, "image"},
		{"layer blob truncated", func(t *testing.T, store string) {
			os.Truncate(layerBlob(t, store), 100)
		}, "digest mismatch"},
		{"layer blob truncated, rootfs gone", func(t *testing.T, store string) {
			os.Truncate(layerBlob(t, store), 100)
			if err := os.RemoveAll(rootfsOf(store)); err != nil {
				t.Fatal(err)
			}
		}, "digest mismatch"},
		{"rootfs gone", func(t *testing.T, store string) {
			if err := os.RemoveAll(rootfsOf(store)); err != nil {
				t.Fatal(err)
			}
		}, "image"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, store := pulled(t)
			tc.corrupt(t, store)
			for try := 1; try <= 2; try++ {
				out := runCLI(t, cfg, "", strings.NewReader(taskJSON), "run", "-")
				assertNoLeaks(t)
				switch {
				case out.res == nil:
					t.Fatalf("try %d: no JSON result: exit %d\n%s\n%s", try, out.code, out.stdout, out.stderr)
				case out.code == 0 && out.res.Stdout == "ok\n" && out.res.ImageDigest == digest:
					t.Logf("try %d: ran on an intact rootfs (digest %s)", try, out.res.ImageDigest)
				case out.code == result.ExitSetup && out.res.Stdout == "" && strings.Contains(out.res.Error, tc.want125):
					t.Logf("try %d: refused: %s", try, out.res.Error)
				default:
					t.Errorf("try %d: exit %d stdout %q error %q; want exit 0 with \"ok\" or 125 with an error containing %q",
						try, out.code, out.res.Stdout, out.res.Error, tc.want125)
				}
			}
		})
	}
}

// TestMissingRunsc: a run on runsc when runsc.path names no usable runsc
// fails with 125 and an error naming the config key.
func TestMissingRunsc(t *testing.T) {
	primeStateDir(t)
	canary := makeCanary(t)
	dir := t.TempDir()
	plain, garbage := filepath.Join(dir, "plain"), filepath.Join(dir, "garbage")
	if err := os.WriteFile(plain, []byte("not a program\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(garbage, []byte("not a program\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, task string
		cfg        map[string]any
		want       string
	}{
		{"task asks for runsc, path missing", `{"code":"print(1)","runtime":"runsc"}`,
			map[string]any{"runsc": map[string]any{"path": "/nonexistent/runsc"}}, "runsc.path"},
		{"config default runsc, path missing", `{"code":"print(1)"}`,
			map[string]any{"runtime": "runsc", "runsc": map[string]any{"path": "/nonexistent/runsc"}}, "runsc.path"},
		{"path not executable", `{"code":"print(1)","runtime":"runsc"}`,
			map[string]any{"runsc": map[string]any{"path": plain}}, "runsc.path"},
		{"path an executable that is not runsc", `{"code":"print(1)","runtime":"runsc"}`,
			map[string]any{"runsc": map[string]any{"path": garbage}}, garbage},
		{"path a directory", `{"code":"print(1)","runtime":"runsc"}`,
			map[string]any{"runsc": map[string]any{"path": "/etc"}}, "runsc.path"},
		{"path relative", `{"code":"print(1)","runtime":"runsc"}`,
			map[string]any{"runsc": map[string]any{"path": "bin/runsc"}}, "runsc.path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := badConfig(t, tc.cfg)
			checkRefused(t, tc.want, 0, canary, func() cliRun { return runCLI(t, cfg, "", strings.NewReader(tc.task), "run", "-") })
		})
	}
}
