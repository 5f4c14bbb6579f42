package launcher

import (
	_ "embed"
	"fmt"
	"path"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/agentrun/agentrun/runtime/spec"
)

// The paths of agentrun's Python launcher inside a sandbox. The Python
// files name those they read as string literals of their own, which
// TestPathsMatchPython holds to these.
const (
	// Dir holds agentrun's Python files, the run's etc tmpfs's directory
	// of them (etcDir) mounted read-only, once for all of them, in the
	// sandbox's own /dev tmpfs: no
	// image needs a mount point, and the sandbox's mountinfo names no host
	// path. It is on a run's PYTHONPATH only with tools (ToolsOpts); the
	// launcher loads its own modules from it by path.
	Dir = "/dev/agentrun-python"

	// StartPath is the launcher's start, agentrun_start.py: the program of
	// a cold or pooled Python run (startArgv), put before its code file.
	StartPath = Dir + "/agentrun_start.py"
	// RunPath is the run launcher, agentrun_run.py, which the start and the
	// warm launcher load.
	RunPath = Dir + "/agentrun_run.py"
	// RunLibPath is the rest of the run launcher, agentrun_runlib.py,
	// loaded at its first need.
	RunLibPath = Dir + "/agentrun_runlib.py"
	// RunCodePath is the run launcher's bytecode, when agentrun has it for
	// the run's image and interpreter (code.go).
	RunCodePath = Dir + "/agentrun_run.pyc"
	// StatePath is a kept state's module, agentrun_state.py, in every run
	// with state and every warm sandbox.
	StatePath = Dir + "/agentrun_state.py"
	// WarmPath is the warm launcher, agentrun_warm.py: a warm sandbox's
	// program (WarmArgs).
	WarmPath = Dir + "/agentrun_warm.py"
	// ToolsPath is agentrun_tools.py, which a run with tools imports.
	ToolsPath = Dir + "/agentrun_tools.py"
	// ReplPath is the REPL launcher, agentrun_repl.py: a code
	// interpreter's context in a live sandbox (internal/e2b/interp), which
	// loads the run launcher.
	ReplPath = Dir + "/agentrun_repl.py"

	// DisplayDir is the sandbox's display directory, writable, in its
	// /dev: the launcher writes its bundles at ChannelPath, agentrun its
	// state request at StateRequestPath, and the launcher its report on
	// the state at StateReportPath.
	DisplayDir       = "/dev/agentrun-display"
	ChannelPath      = DisplayDir + "/" + displayFile
	StateRequestPath = DisplayDir + "/" + stateRequestFile
	StateReportPath  = DisplayDir + "/" + stateReportFile
)

// The files of the display directory.
const (
	displayFile      = "bundles"
	stateRequestFile = "state-request"
	stateReportFile  = "state"
)

// etcDir is where the run's etc tmpfs holds agentrun's Python files, each
// under its name in Dir.
const etcDir = "python"

// The Python files, each named as in Dir.
var (
	//go:embed agentrun_start.py
	startSource []byte
	//go:embed agentrun_run.py
	runSource []byte
	//go:embed agentrun_runlib.py
	runLibSource []byte
	//go:embed agentrun_state.py
	stateSource []byte
	//go:embed agentrun_warm.py
	warmSource []byte
	//go:embed agentrun_tools.py
	toolsSource []byte
	//go:embed agentrun_repl.py
	replSource []byte
)

// mount writes data, agentrun's file at in (a path in Dir), into the run's
// etc tmpfs with etc, and returns the spec option that mounts the
// directory holding it there at Dir, read-only (dirMount): one mount for
// all of a run's Python files, whichever it has.
func mount(etc WriteFunc, in string, data []byte) (spec.SpecOpt, error) {
	host, err := etc(etcDir+"/"+path.Base(in), data)
	if err != nil {
		return nil, err
	}
	return dirMount(path.Dir(host)), nil
}

// dirMount is the spec option that bind-mounts host, the etc tmpfs's
// directory of agentrun's Python files, at Dir, read-only, unless the spec
// already has it: every file's option names the same mount, and the
// sandbox gets it once. A mount at Dir from elsewhere is an error. The
// sandbox sees what the directory holds when it starts: the files its
// run wrote, and no other run's (each run has an etc tmpfs of its own).
func dirMount(host string) spec.SpecOpt {
	bind := spec.WithReadonlyFile(host, Dir)
	return func(s *specs.Spec) error {
		for _, m := range s.Mounts {
			if m.Destination != Dir {
				continue
			}
			if m.Source != host || m.Type != "bind" || !slices.Contains(m.Options, "ro") {
				return fmt.Errorf("%s is mounted from %s already", Dir, m.Source)
			}
			return nil
		}
		return bind(s)
	}
}
