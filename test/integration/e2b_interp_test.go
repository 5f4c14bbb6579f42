package integration

import "testing"

// TestE2BCodeInterpreter: the real @e2b/code-interpreter's runCode and
// contexts through serve's E2B door, in a live sandbox of the
// python-data image (test/e2b-client/interp.mjs): a value, streamed
// prints, state kept from cell to cell, an exception's name, value and
// traceback, a matplotlib figure as PNG, a pandas frame as HTML, the
// other formats, env vars, a cell past the SDK's timeout interrupted,
// contexts made (cwd), listed, restarted, removed, bash cells and a bash
// context keeping the shell's state, a language without an interpreter
// refused with a message, and frames that the code prints
// read as its stdout, never as results; nothing left after serve's stop.
func TestE2BCodeInterpreter(t *testing.T) { eachRuntime(t, testE2BCodeInterpreter) }

func testE2BCodeInterpreter(t *testing.T, rt string) {
	pythonData(t)
	s := startE2B(t, []string{"alice"}, map[string]any{"runtime": rt, "sandboxes": map[string]any{"max": 2}})
	seen := s.node(t, s.keys["alice"], "interp.mjs", "python-data")
	for _, name := range []string{"value", "streams", "state", "string-value", "error", "figure", "dataframe",
		"display-formats", "forged-frame", "env", "contexts", "bash", "other-language", "timeout"} {
		var got string
		e2bGot(t, seen, name, &got)
		if got != "ok" {
			t.Errorf("%s: %s", name, got)
		}
	}
	s.stop()
	assertNoLeaks(t)
}
