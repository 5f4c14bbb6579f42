package launcher

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/runtime/spec"
)

// TestPythonFilesOneMount: a run's Python files, however many it has (the
// run launcher, its start and bytecode, its library, the state module, the
// tools module), reach the sandbox as one read-only mount of the etc
// tmpfs's directory at Dir, which holds each under its name and nothing
// else; a mount at Dir from elsewhere is refused.
func TestPythonFilesOneMount(t *testing.T) {
	etcRoot := t.TempDir()
	etc := func(name string, data []byte) (string, error) {
		out := filepath.Join(etcRoot, name)
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return "", err
		}
		return out, os.WriteFile(out, data, 0o644)
	}
	opts, err := runFiles(etc, []byte("code"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		at   string
		data []byte
	}{{RunLibPath, runLibSource}, {StatePath, stateSource}, {WarmPath, warmSource}} {
		opt, err := mount(etc, f.at, f.data)
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, opt)
	}
	tools, err := ToolsOpts(etc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := spec.New("/r", append(opts, tools...)...)
	if err != nil {
		t.Fatalf("spec.New: %v", err)
	}
	var at []string
	for _, m := range s.Mounts {
		if m.Destination == Dir || strings.HasPrefix(m.Destination, Dir+"/") {
			at = append(at, m.Destination)
			if m.Source != filepath.Join(etcRoot, etcDir) || m.Type != "bind" || !slices.Contains(m.Options, "ro") {
				t.Errorf("mount at %s: %+v; want a read-only bind of %s", m.Destination, m, filepath.Join(etcRoot, etcDir))
			}
		}
	}
	if !slices.Equal(at, []string{Dir}) {
		t.Errorf("mounts in %s: %q; want one, of the directory", Dir, at)
	}
	entries, err := os.ReadDir(filepath.Join(etcRoot, etcDir))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	want := []string{"agentrun_run.py", "agentrun_run.pyc", "agentrun_runlib.py", "agentrun_start.py",
		"agentrun_state.py", "agentrun_tools.py", "agentrun_warm.py"}
	if !slices.Equal(names, want) {
		t.Errorf("the directory holds %q; want %q", names, want)
	}
	for _, p := range []string{RunPath, RunCodePath, RunLibPath, StartPath, StatePath, ToolsPath, WarmPath} {
		if filepath.Dir(p) != Dir {
			t.Errorf("%s is not in %s", p, Dir)
		}
	}

	other := spec.WithReadonlyFile("/elsewhere", Dir)
	if _, err := spec.New("/r", append([]spec.SpecOpt{other}, opts...)...); err == nil {
		t.Error("a mount at Dir from elsewhere was taken")
	}
}
