package launcher

import (
	"maps"
	"regexp"
	"slices"
	"testing"

	"github.com/agentrun/agentrun/internal/e2b/interp"
)

// TestReplPath: the E2B door's code interpreter starts the REPL launcher
// where a live sandbox has it.
func TestReplPath(t *testing.T) {
	if interp.ReplPath != ReplPath {
		t.Errorf("interp.ReplPath %q; the launcher's is %q", interp.ReplPath, ReplPath)
	}
}

// TestPathsMatchPython: every path inside the sandbox that a Python file
// names (a string literal under /dev/) is one of the table's, and each of
// the table's paths that the Python files read is named by the files
// that read it.
func TestPathsMatchPython(t *testing.T) {
	sources := map[string][]byte{
		"agentrun_start.py": startSource, "agentrun_run.py": runSource, "agentrun_runlib.py": runLibSource,
		"agentrun_state.py": stateSource, "agentrun_warm.py": warmSource, "agentrun_tools.py": toolsSource,
		"agentrun_repl.py": replSource,
	}
	want := map[string][]string{
		"agentrun_start.py":  {RunPath, RunCodePath},
		"agentrun_run.py":    {RunLibPath, StatePath, StateRequestPath},
		"agentrun_runlib.py": {ChannelPath},
		"agentrun_state.py":  {StateReportPath},
		"agentrun_warm.py":   {RunPath, RunLibPath, StatePath},
		"agentrun_tools.py":  nil,
		"agentrun_repl.py":   {RunPath},
	}
	literal := regexp.MustCompile(`["'](/dev/[^"'\s]*)["']`)
	for name, src := range sources {
		named := map[string]bool{}
		for _, m := range literal.FindAllSubmatch(src, -1) {
			named[string(m[1])] = true
		}
		got := slices.Sorted(maps.Keys(named))
		if w := slices.Sorted(slices.Values(want[name])); !slices.Equal(got, w) {
			t.Errorf("%s names the sandbox's paths %q; want %q", name, got, w)
		}
	}
}
