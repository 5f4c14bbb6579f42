package launcher

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/image"
	"github.com/agentrun/agentrun/internal/cachefile"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/test/testenv"
)

// TestLauncherKey: one bytecode per image (its digest; a dir: image's
// rootfs) and interpreter.
func TestLauncherKey(t *testing.T) {
	a := &image.Image{Ref: "a", Digest: "sha256:aa", Rootfs: "/store/aa"}
	keys := map[string]string{
		"image a, python3":        launcherKey(a, "python3"),
		"image a, python3.11":     launcherKey(a, "python3.11"),
		"image b, python3":        launcherKey(&image.Image{Ref: "a", Digest: "sha256:bb", Rootfs: "/store/aa"}, "python3"),
		"dir image, python3":      launcherKey(&image.Image{Ref: "dir:/x", Rootfs: "/x"}, "python3"),
		"other dir image, python": launcherKey(&image.Image{Ref: "dir:/y", Rootfs: "/y"}, "python3"),
	}
	seen := map[string]string{}
	for name, k := range keys {
		if len(k) != 64 || strings.Trim(k, "0123456789abcdef") != "" {
			t.Errorf("%s: key %q is not a file name of hex", name, k)
		}
		if other, ok := seen[k]; ok {
			t.Errorf("%s and %s share key %s", name, other, k)
		}
		seen[k] = name
	}
	if launcherKey(a, "python3") != keys["image a, python3"] {
		t.Error("the key of the same image and interpreter changed")
	}
}

// TestLauncherCodeFiles: bytecode is written whole, read back within its
// bound, and at most maxLauncherCodes files are kept, the newest.
func TestLauncherCodeFiles(t *testing.T) {
	testenv.RequireRoot(t) // a cache file is root's
	dir := filepath.Join(t.TempDir(), "launcher")
	if err := writeLauncherCode(dir, "k", []byte("bytecode")); err != nil {
		t.Fatal(err)
	}
	if b, err := readLauncherCode(filepath.Join(dir, "k")); err != nil || string(b) != "bytecode" {
		t.Fatalf("read back %q, %v", b, err)
	}
	for _, n := range []int{0, 4, maxLauncherCode + 1} {
		path := filepath.Join(dir, fmt.Sprintf("size%d", n))
		if err := os.WriteFile(path, bytes.Repeat([]byte{1}, n), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := readLauncherCode(path); err == nil {
			t.Errorf("a file of %d bytes was read as bytecode", n)
		}
	}
	if _, err := readLauncherCode(filepath.Join(dir, "missing")); !os.IsNotExist(err) {
		t.Errorf("a missing file: %v", err)
	}
	// A writer's temporary file left a while ago goes too.
	stale := filepath.Join(dir, ".tmp-stale")
	if err := os.WriteFile(stale, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	os.Chtimes(stale, old, old)
	for i := range maxLauncherCodes + 3 {
		if err := writeLauncherCode(dir, fmt.Sprintf("n%03d", i), []byte("bytecode")); err != nil {
			t.Fatal(err)
		}
		then := old.Add(time.Duration(i) * time.Second)
		os.Chtimes(filepath.Join(dir, fmt.Sprintf("n%03d", i)), then, then)
	}
	names, _ := filepath.Glob(filepath.Join(dir, "*"))
	hidden, _ := filepath.Glob(filepath.Join(dir, ".*"))
	if len(names) != maxLauncherCodes || len(hidden) != 0 {
		t.Fatalf("%d files and %v left, want %d and no temporary one", len(names), hidden, maxLauncherCodes)
	}
	if _, err := os.Stat(filepath.Join(dir, fmt.Sprintf("n%03d", maxLauncherCodes+2))); err != nil {
		t.Errorf("the newest file is gone: %v", err)
	}
}

// TestLauncherCodesInMemory: at most maxLauncherCodes, the oldest going.
func TestLauncherCodesInMemory(t *testing.T) {
	c := NewCodes(t.TempDir(), nil, nil)
	defer c.Close()
	for i := range maxLauncherCodes + 5 {
		c.keep(fmt.Sprint(i), []byte("x"))
	}
	c.keep("7", []byte("again"))
	if len(c.mem) != maxLauncherCodes || len(c.order) != maxLauncherCodes {
		t.Fatalf("%d kept, order of %d; want %d", len(c.mem), len(c.order), maxLauncherCodes)
	}
	if _, ok := c.mem["0"]; ok {
		t.Error("the oldest was kept")
	}
	if string(c.mem["7"]) != "again" {
		t.Errorf("key 7 holds %q", c.mem["7"])
	}
}

// TestCompilePlan: the compile's sandbox runs the run's interpreter on
// agentrun's program alone: nothing of the task's but its image, runtime
// and limits, its timeout and output bound the compile's own.
func TestCompilePlan(t *testing.T) {
	cfg := config.Default()
	p, err := task.Load([]byte(`{"language":"python","code":"print(1)","stdin":"in","env":{"PYTHONSTARTUP":"/workspace/x.py"},
		"files":{"x.py":{"content":"import os"}},"network":{"allow":["example.test"]},"limits":{"memory":"128MiB","timeout":"50s"}}`), cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := compilePlan(p)
	if c.Image != p.Image || c.Runtime != p.Runtime || c.Argv[0] != p.Argv[0] || c.Argv[len(c.Argv)-1] != compileLauncher {
		t.Errorf("compile plan %q on %s, %s; want the run's image, runtime and interpreter", c.Argv, c.Image, c.Runtime)
	}
	if strings.Join(c.Argv[1:4], " ") != "-I -S -c" {
		t.Errorf("interpreter options %q, want -I -S -c", c.Argv[1:4])
	}
	if len(c.Env) != 0 || len(c.Files) != 0 || c.Stdin != nil || c.Code != nil || c.Allow != nil || c.Session != "" || c.KeepWorkspace {
		t.Errorf("the compile plan holds the task's env %v, files %v, stdin, code, network or session", c.Env, c.Files)
	}
	if c.Limits.Memory != p.Limits.Memory || c.Limits.Timeout != launcherCompileTimeout || c.Limits.OutputBytes < 4*maxLauncherCode/3 {
		t.Errorf("compile limits %+v", c.Limits)
	}
	if startArgv(c) != nil {
		t.Error("the compile would run through the launcher")
	}
}

// TestLauncherCodesAfter: a one-shot runner's miss compiles nothing
// during its run; MakePending compiles it after, once, and keeps it for
// the next process. A failed compile is marked, and the next one-shot
// runner leaves that key for launcherRetry, where a long-lived one tries.
func TestLauncherCodesAfter(t *testing.T) {
	testenv.RequireRoot(t) // a cache file is root's
	dir := filepath.Join(t.TempDir(), "launcher")
	p, err := task.Load([]byte(`{"language":"python","code":"print(1)"}`), config.Default())
	if err != nil {
		t.Fatal(err)
	}
	img := &image.Image{Ref: "dir:/x", Rootfs: "/x"}
	compiles := 0
	ok := func(context.Context, *task.Plan, *image.Image) (*result.Result, error) {
		compiles++
		return &result.Result{Stdout: base64.StdEncoding.EncodeToString([]byte("magicbytecode")) + "\n"}, nil
	}
	failing := func(context.Context, *task.Plan, *image.Image) (*result.Result, error) {
		compiles++
		return &result.Result{ExitCode: 1, Stderr: "SyntaxError"}, nil
	}

	// oneShot is a one-shot process's run and what it does after.
	oneShot := func(compile CompileFunc, runs int) {
		c := NewCodes(dir, compile, func(string, ...any) {})
		c.MakeAfter()
		before := compiles
		for range runs {
			if b := c.For(p, img); b != nil {
				t.Fatalf("a miss gave %q", b)
			}
		}
		if compiles != before {
			t.Fatalf("%d compiles during the runs; want none", compiles)
		}
		c.MakePending(context.Background())
		c.Close()
	}
	oneShot(failing, 2)
	if compiles != 1 {
		t.Fatalf("%d compiles after two misses of one key; want 1", compiles)
	}
	// The next one-shot process leaves the key whose compile failed.
	oneShot(ok, 1)
	if compiles != 1 {
		t.Errorf("a one-shot runner compiled a key that failed a moment ago")
	}
	// A long-lived one tries, and its bytecode is every runner's.
	c := NewCodes(dir, ok, nil)
	c.Make()
	c.For(p, img)
	c.Close()
	if compiles != 2 {
		t.Fatalf("%d compiles; want the long-lived runner's", compiles)
	}
	c = NewCodes(dir, ok, nil)
	c.MakeAfter()
	if b := c.For(p, img); string(b) != "magicbytecode" {
		t.Errorf("the next process's run got %q, want the kept bytecode", b)
	}
	c.Close()

	// Past launcherRetry a one-shot runner tries again.
	os.Remove(filepath.Join(dir, launcherKey(img, p.Argv[0])))
	old := strconv.FormatInt(time.Now().Add(-2*launcherRetry).Unix(), 10)
	if err := cachefile.Write(dir, launcherKey(img, p.Argv[0])+failedSuffix, []byte(old)); err != nil {
		t.Fatal(err)
	}
	oneShot(ok, 1)
	if compiles != 3 {
		t.Errorf("%d compiles; want one more past launcherRetry", compiles)
	}
	if b, err := readLauncherCode(filepath.Join(dir, launcherKey(img, p.Argv[0]))); err != nil || string(b) != "magicbytecode" {
		t.Errorf("kept %q, %v", b, err)
	}
}
