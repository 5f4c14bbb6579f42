package launcher

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/image"
	"github.com/agentrun/agentrun/internal/cleanup"
	"github.com/agentrun/agentrun/internal/safefs"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/runtime/backend"
	"github.com/agentrun/agentrun/runtime/spec"
)

// A Python run shows what a notebook shows: its code's last expression's
// value and each object it displays (display(obj), a matplotlib figure
// shown or left open), as MIME bundles in the result (Value, Display).
// agentrun's run launcher (agentrun_run.py) runs the code: a cold or
// pooled run's program is the launcher's start, put before the code file
// in the language's argv, and a warm run's launcher (agentrun_warm.py)
// runs the code through it. The launcher writes each bundle as a JSON
// line into a file of the sandbox's display directory, a small tmpfs of
// the run's own, which agentrun reads as the program's own words
// (DisplayReader).

// WriteFunc writes data as name, a path in the run's etc tmpfs (its
// parent directories made), and returns its host path: the runner's
// tmpfs of what a sandbox is shown read-only, whose files the sandbox's
// mountinfo names by their path in it, never by a host path.
type WriteFunc func(name string, data []byte) (string, error)

// Request is the sandbox that For sets the launcher up for.
type Request struct {
	Plan  *task.Plan
	Image *image.Image
	// Dir is the run dir: the display tmpfs is mounted at Dir/display.
	Dir string
	// UID is the sandbox's own uid, whose the display tmpfs is.
	UID int
	// Etc writes into the run's etc tmpfs, whence the files are mounted.
	Etc  WriteFunc
	Undo *cleanup.Cleanup
	// Codes holds the run launcher's bytecode (nil: none is used).
	Codes *Codes
	// State is the run's state request; nil for a run without state and
	// for a sandbox made ahead, which gets its run's at the take
	// (StateRequest.Write).
	State *StateRequest
	// Warm, if not nil, is a warm sandbox's program: the language's argv
	// with WarmArgs in place of its file.
	Warm []string
	// Compile: the sandbox compiles the run launcher (Codes): it gets the
	// run launcher's source and nothing else.
	Compile bool
	// Live: the sandbox is a live one, whose code interpreter's contexts
	// run the REPL launcher (ReplPath) as processes exec'd into it: it
	// gets the REPL launcher, the run launcher and its library, and
	// nothing else (its program stays its own).
	Live bool
}

// Setup is what For made of the launcher for a sandbox.
type Setup struct {
	// Opts are the spec options: the Python files' mounts, the display
	// directory's, and the program's argv where the launcher is it.
	Opts []spec.SpecOpt
	// Display is the display directory, held open (safefs: the sandbox
	// writes in it); nil without one.
	Display *safefs.Dir
}

// For sets up what of the launcher the sandbox of req needs, pushing its
// undo on req.Undo: for a run of Python code (startArgv), and for a warm
// sandbox, which a run of Python code takes, the run launcher (with its
// bytecode, if req.Codes has it), the display directory and, with a state
// request or warm, the state's module; the launcher's start or the warm
// launcher becomes the program. Any other sandbox gets nothing.
func For(req Request) (Setup, error) {
	if req.Compile {
		// The launcher alone, which the compile reads.
		opts, err := runFiles(req.Etc, nil)
		return Setup{Opts: opts}, err
	}
	if req.Live {
		return liveFiles(req.Etc)
	}
	argv := startArgv(req.Plan)
	if argv == nil && req.Warm == nil {
		return Setup{}, nil
	}
	var code []byte
	if argv != nil && req.Codes != nil {
		code = req.Codes.For(req.Plan, req.Image)
	}
	opts, display, err := values(req, code)
	if err != nil {
		return Setup{}, err
	}
	if argv != nil {
		opts = append(opts, spec.WithArgs(argv...))
	}
	if req.Warm != nil {
		warm, err := mount(req.Etc, WarmPath, warmSource)
		if err != nil {
			return Setup{}, fmt.Errorf("writing the warm launcher: %w", err)
		}
		opts = append(opts, spec.WithArgs(req.Warm...), warm)
	}
	return Setup{Opts: opts, Display: display}, nil
}

// liveFiles writes the REPL launcher, the run launcher and its library
// into the run's etc tmpfs with etc, and returns their mounts, read-only.
func liveFiles(etc WriteFunc) (Setup, error) {
	var opts []spec.SpecOpt
	for _, f := range []struct {
		at   string
		data []byte
	}{{ReplPath, replSource}, {RunPath, runSource}, {RunLibPath, runLibSource}} {
		opt, err := mount(etc, f.at, f.data)
		if err != nil {
			return Setup{}, fmt.Errorf("writing the REPL launcher: %w", err)
		}
		opts = append(opts, opt)
	}
	return Setup{Opts: opts}, nil
}

// WarmArgs are what a warm sandbox's program has in place of the code
// file in the language's argv: the warm launcher, the hand-over's
// descriptor (backend.FDArg), the modules it imports ahead, and file.
func WarmArgs(preload []string, file string) []string {
	return []string{WarmPath, backend.FDArg, strings.Join(preload, ","), file}
}

// ToolsOpts are the spec options of a run with tools: agentrun_tools at
// ToolsPath, read-only, and Dir first on PYTHONPATH (before any the task
// gives).
func ToolsOpts(etc WriteFunc) ([]spec.SpecOpt, error) {
	opt, err := mount(etc, ToolsPath, toolsSource)
	if err != nil {
		return nil, fmt.Errorf("writing agentrun_tools: %w", err)
	}
	return []spec.SpecOpt{opt, spec.WithEnvListFirst("PYTHONPATH", Dir)}, nil
}

// isPythonName reports whether name is that of a Python interpreter:
// python, python3, python3.11 (python, then digits, then a dot and digits).
// Checked byte by byte: a regular expression would be compiled at package
// init, in every container's init too (agentrun re-executed).
func isPythonName(name string) bool {
	v, ok := strings.CutPrefix(name, "python")
	if !ok {
		return false
	}
	if v == "" {
		return true
	}
	major, minor, dotted := strings.Cut(v, ".")
	return digits(major) && (!dotted || digits(minor))
}

// digits reports whether s is one or more of 0-9.
func digits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// startArgv is p's argv with the launcher's start before its code file,
// when p runs the code file of Python code with a Python interpreter:
// "python3 [OPTION...] /workspace/main.py [ARG...]", as the Python
// languages' argv makes it, where every option starts with "-" and is not
// -c or -m; nil for any other program. It reads the argv alone, as a
// pooled sandbox's shape does (a bare plan has no code file).
func startArgv(p *task.Plan) []string {
	if len(p.Argv) < 2 || !isPythonName(path.Base(p.Argv[0])) {
		return nil
	}
	file := spec.WorkspaceDir + "/" + task.CodeFileName("python")
	for i, a := range p.Argv[1:] {
		switch {
		case a == file:
			return slices.Concat(p.Argv[:i+1], []string{StartPath}, p.Argv[i+1:])
		case !strings.HasPrefix(a, "-") || a == "-c" || a == "-m" || a == "-":
			return nil
		}
	}
	return nil
}

// runFiles writes the run launcher, its start and, if not nil, its
// bytecode code (code.go) into the run's etc tmpfs with etc, and returns
// their spec options.
func runFiles(etc WriteFunc, code []byte) ([]spec.SpecOpt, error) {
	files := []struct {
		at   string
		data []byte
	}{{RunPath, runSource}, {StartPath, startSource}, {RunCodePath, code}}
	var opts []spec.SpecOpt
	for _, f := range files {
		if f.data == nil {
			continue
		}
		opt, err := mount(etc, f.at, f.data)
		if err != nil {
			return nil, fmt.Errorf("writing the run launcher: %w", err)
		}
		opts = append(opts, opt)
	}
	return opts, nil
}

// values sets up what shows a run's values in the sandbox of req: the run
// launcher (with code, its bytecode, if not nil) and its library, from the
// run's etc tmpfs, and the display directory, a tmpfs of maxDisplayChannel
// owned by req.UID at req.Dir/display; with the state module and
// req.State's request (not nil), or the module alone (a warm sandbox). It
// returns their spec options and the display directory, held open.
func values(req Request, code []byte) ([]spec.SpecOpt, *safefs.Dir, error) {
	specOpts, err := runFiles(req.Etc, code)
	if err != nil {
		return nil, nil, err
	}
	lib, err := mount(req.Etc, RunLibPath, runLibSource)
	if err != nil {
		return nil, nil, fmt.Errorf("writing the run launcher: %w", err)
	}
	display := filepath.Join(req.Dir, "display")
	if err := os.Mkdir(display, 0o700); err != nil {
		return nil, nil, fmt.Errorf("creating the run's display tmpfs: %w", err)
	}
	opts := fmt.Sprintf("size=%d,nr_inodes=16,mode=0700,uid=%d,gid=%d", maxDisplayChannel, req.UID, req.UID)
	if err := unix.Mount("tmpfs", display, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return nil, nil, fmt.Errorf("mounting the run's display tmpfs: %w", err)
	}
	req.Undo.Add(func() error {
		if err := unix.Unmount(display, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmounting the run's display tmpfs: %w", err)
		}
		return nil
	})
	dd, err := safefs.Open(display)
	if err != nil {
		return nil, nil, fmt.Errorf("opening the run's display tmpfs: %w", err)
	}
	req.Undo.Add(dd.Close)
	specOpts = append(specOpts, lib, spec.WithWritableDir(display, DisplayDir))
	if req.State != nil || req.Warm != nil {
		module, err := mount(req.Etc, StatePath, stateSource)
		if err != nil {
			return nil, nil, fmt.Errorf("writing the state module: %w", err)
		}
		specOpts = append(specOpts, module)
	}
	if req.State != nil {
		if err := req.State.Write(dd); err != nil {
			return nil, nil, err
		}
	}
	return specOpts, dd, nil
}
