package launcher

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// splitCase is a program, the arguments it runs with, whether the run
// launcher's split() takes it (fast) and what its run must show (want:
// each in its stdout, stderr or display channel, on both ways).
type splitCase struct {
	name string
	code string
	args []string
	fast bool
	want []string
}

const frameLike = `class Frame:
    def __repr__(self):
        return "   a  b\n0  1  2\n1  3  4"
    def _repr_html_(self):
        return "<table><tr><td>1</td></tr></table>"
`

var splitCases = []splitCase{
	{name: "sum", code: "1+1\n", fast: true, want: []string{`"text/plain": "2"`}},
	{name: "constant", code: "42", fast: true, want: []string{`"text/plain": "42"`}},
	{name: "none", code: "x = None\nNone\n", fast: true},
	{name: "print", code: "print(45)\n", fast: true, want: []string{"45\n"}},
	{name: "frame-like", code: frameLike + "Frame()\n", fast: true, want: []string{`"text/html": "<table>`, `a  b\u000a0  1  2`}},
	{name: "string", code: "'a' + 'b'\n", fast: true, want: []string{`"text/plain": "'ab'"`}},
	{name: "string-only", code: "'doc'\n", fast: true, want: []string{`'doc'`}},
	{name: "docstring", code: "'doc'\nprint(__doc__)\n__doc__\n", fast: true, want: []string{"doc\n"}},
	{name: "raise-last", code: "x = 1\n\n1 / (x - 1)\n", fast: true, want: []string{`line 3, in <module>`, "ZeroDivisionError"}},
	{name: "raise-before", code: "print('a')\n{}['k']\n2\n", fast: true, want: []string{`line 2, in <module>`, "KeyError"}},
	{name: "raise-deeper", code: "def f(v):\n    return v[5]\nf(\n  [1, 2],\n)\n", fast: true, want: []string{`line 3, in <module>`, `line 2, in f`, "IndexError"}},
	{name: "raise-carets", code: "x = {'a': [1]}\nprint(x['a'][0] + x['a'][1] * 2)\n", fast: true, want: []string{`~~~~~~^^^`}},
	{name: "name-error", code: "undefined_name\n", fast: true, want: []string{"NameError"}},
	{name: "syntax-error-last", code: "x = 1\ny = (\n", want: []string{"SyntaxError"}},
	{name: "syntax-error-before", code: "x = (\n]\n1\n", want: []string{"SyntaxError", "line 2"}},
	{name: "syntax-error-expression", code: "1 +\n", want: []string{"SyntaxError"}},
	{name: "multi-line-last", code: "x = 2\n(x +\n  3 *\n  x)\n", fast: true, want: []string{`"8"`}},
	{name: "closers", code: "f = lambda *a: a\nf(\n    [\n        1,\n    ],\n)\n]\n", want: []string{"SyntaxError"}},
	{name: "multi-line-call", code: "max(\n    1,\n    7,\n)  # the biggest\n", fast: true, want: []string{`"7"`}},
	{name: "backslash-before", code: "x = 1 + \\\n  2\nx\n", fast: true, want: []string{`"3"`}},
	{name: "backslash-into-last", code: "y = 1\n2 + \\\n3\n", want: []string{`"5"`}},
	{name: "backslash-last-col0", code: "y = 1 + \\\n2\n", want: nil},
	{name: "trailing-comments", code: "1 + 1  # two\n# the end\n\n   \n\t# more\n", fast: true, want: []string{`"2"`}},
	{name: "indented-comment", code: "x = 4\n    # indented\nx\n", fast: true, want: []string{`"4"`}},
	{name: "semicolons", code: "x = 1; x + 1\n", want: []string{`"2"`}},
	{name: "semicolon-last", code: "x = 1\nx; x + 2\n", want: []string{`"3"`}},
	{name: "decorator", code: "def d(f):\n    return f\n@d\ndef g():\n    return 3\ng()\n", fast: true, want: []string{`"3"`}},
	{name: "decorated-last", code: "def d(f):\n    return f\n@d\ndef g():\n    return 3\n"},
	{name: "try-else", code: "try:\n    x = 1\nexcept ValueError:\n    pass\nelse:\n    x = 2\nx\n", fast: true, want: []string{`"2"`}},
	{name: "try-finally-last", code: "try:\n    x = 1\nfinally:\n    x = 2\n"},
	{name: "final-if", code: "if True:\n    5\n"},
	{name: "final-if-else", code: "if 0:\n    1\nelse:\n    2\n"},
	{name: "if-then-value", code: "if True:\n\tx = 5\nx\n", fast: true, want: []string{`"5"`}},
	{name: "indented-last", code: "if True:\n    x = 1\n    x\n"},
	{name: "walrus", code: "print(1)\n(y := 5)\n", fast: true, want: []string{`"5"`}},
	{name: "walrus-comprehension", code: "[(z := i) for i in range(3)]\n", fast: true, want: []string{`"[0, 1, 2]"`}},
	{name: "walrus-bare", code: "y := 5\n", want: []string{"SyntaxError"}},
	{name: "lambda", code: "f = lambda x: x * 2\n(lambda: f(21))()\n", fast: true, want: []string{`"42"`}},
	{name: "unicode", code: "s = 'héllo ☃'\ns + ' ✓'\n", fast: true, want: []string{"héllo ☃ ✓"}},
	{name: "unicode-error", code: "s = '☃☃'\ns + 1\n", fast: true, want: []string{"TypeError", "s + 1"}},
	{name: "coding", code: "# -*- coding: latin-1 -*-\ns = 'caf\xe9'\ns\n", want: []string{"café"}},
	{name: "coding-last", code: "# -*- coding: latin-1 -*-\n'caf\xc3\xa9'\n", want: []string{"cafÃ©"}},
	{name: "bom", code: "\xef\xbb\xbf1 + 2\n", want: []string{`"3"`}},
	{name: "crlf", code: "x = 1\r\nx + 1\r\n", want: []string{`"2"`}},
	{name: "cr", code: "x = 1\rx + 2\r", want: []string{`"3"`}},
	{name: "cr-lines", code: "x = 1\ry = 0\nx / y\n", want: []string{"line 3, in <module>"}},
	{name: "form-feed", code: "x = 1\n\x0cx + 3\n", want: []string{`"4"`}},
	{name: "future", code: "from __future__ import annotations\ndef f(a: int): pass\nf.__annotations__\n", want: []string{`{'a': 'int'}`}},
	{name: "future-last", code: "from __future__ import barry_as_FLUFL\n1 != 2\n", want: []string{`"True"`}},
	{name: "empty", code: "", fast: true},
	{name: "comment-only", code: "# nothing\n\n# here\n", fast: true},
	{name: "indented-only", code: "    x = 1\n", want: []string{"IndentationError"}},
	{name: "argv", args: []string{"a", "b c"}, fast: true, code: `import sys, os
print(sys.argv, os.path.basename(__file__), __name__, sys.modules['__main__'].__file__ == __file__)
print(sys.path[0] == os.path.dirname(os.path.realpath(__file__)), __doc__, __spec__, __loader__.name, __cached__)
print(sys.orig_argv[-3:] == [__file__, 'a', 'b c'], __annotations__)
sys.argv
`, want: []string{"'a', 'b c']", "main.py __main__ True", "True None None __main__ None", "True {}"}},
	{name: "exit-before", code: "import sys\nsys.exit(3)\n4\n", fast: true},
	{name: "exit-last", code: "import sys\nsys.exit(4)\n", fast: true},
	{name: "repr-raises", code: "class A:\n    def __repr__(self):\n        raise ValueError('no')\nA()\n", fast: true, want: []string{"repr failed"}},
	{name: "excepthook", code: "import sys\nsys.excepthook = lambda t, v, tb: print('hook', t.__name__, tb.tb_lineno)\n1 / 0\n", fast: true, want: []string{"hook ZeroDivisionError 3"}},
	{name: "frame", code: "import sys\nsys._getframe().f_globals is globals(), sys._getframe().f_code.co_name, sys._getframe().f_lineno, locals() is globals()\n", fast: true,
		want: []string{`(True, '<module>', 2, True)`}},
	{name: "annotations", code: "x: int = 1\n__annotations__\n", fast: true, want: []string{`int`}},
	{name: "match-name", code: "match = lambda v: v\nmatch(3)\n", fast: true, want: []string{`"3"`}},
	{name: "match-statement", code: "match 1:\n    case 1:\n        pass\n"},
	{name: "global", code: "global q\nq = 1\nq\n", fast: true, want: []string{`"1"`}},
	{name: "class-then-value", code: "class C:\n    1\nC.__name__\n", fast: true, want: []string{`"'C'"`}},
	{name: "open-string-before", code: "s = \"\"\"\nx\n\"\"\"\ns\n", fast: true, want: []string{`'\\nx\\n'`}},
	{name: "string-last-multi-line", code: "\"\"\"\nabc\n\"\"\"\n", want: []string{`'\\nabc\\n'`}},
	{name: "await", code: "await x\n", want: []string{"SyntaxError"}},
	{name: "yield", code: "yield 1\n", want: []string{"SyntaxError"}},
	{name: "null-byte", code: "x = 1\x00\nx\n", want: []string{"null bytes"}},
	{name: "invalid-utf8", code: "x = 1\n'\xff'\n", want: []string{"SyntaxError"}},
	{name: "warning-last", code: "x = 1\nx is 1\n", want: []string{"SyntaxWarning"}},
	{name: "warning-before", code: "x = 1\nif x is 1: pass\nx\n", want: []string{"SyntaxWarning"}},
	{name: "warning-and-statement", code: "x = 1\ny = x is 1\n", want: []string{"SyntaxWarning"}},
	{name: "builtins-rebound", code: "__builtins__ = {}\nlen('ab')\n", want: []string{`"2"`}},
	{name: "builtins-rebound-unnamed", code: "g = globals()\ng['__buil' 'tins__'] = {}\nlen('ab')\n", fast: true, want: []string{`"2"`}},
	{name: "hook-replaced", code: "import builtins\nsetattr(builtins, '__agentrun_' 'value__', lambda v: print('hooked', v))\n5\n", fast: true, want: []string{"hooked 5"}},
	{name: "display", code: "print('a')\ndisplay(1)\n2\n", fast: true, want: []string{`{"display": {"text/plain": "1"}}`, `"2"`}},
	{name: "builtins-replaced", code: "import builtins\nbuiltins.open = builtins.compile = builtins.exec = builtins.eval = None\n6 * 7\n", fast: true, want: []string{`"42"`}},
	{name: "file-names", code: "import sys\ndef f():\n    return lambda: 0\nclass C:\n    def m(self):\n        pass\n" +
		"{c.co_filename == __file__ for c in (f.__code__, f().__code__, C.m.__code__, (lambda: 0).__code__, sys._getframe().f_code)}\n",
		fast: true, want: []string{`"{True}"`}},
	{name: "sys-replaced", code: "import sys\nsys.settrace = sys.gettrace = None\n6 * 7\n", fast: true, want: []string{`"42"`}},
	{name: "audit-hook", code: "import sys\ndef hook(event, args):\n    pass\nhook.__cantrace__ = True\nsys.addaudithook(hook)\n6 * 7\n", fast: true, want: []string{`"42"`}},
	{name: "tracer", code: "import sys\nprint(sys.gettrace() is None)\n1\n", fast: true, want: []string{"True\n"}},
	{name: "long-last", code: "x = 1\n" + strings.Repeat("x + ", 500) + "x\n", fast: true, want: []string{`"501"`}},
}

// traced are the cases TestSplitSameAsProgram runs a third time, with a
// trace function set.
var traced = map[string]bool{"sum": true, "raise-deeper": true, "file-names": true, "tracer": true}

// TestSplitSameAsProgram runs each of splitCases on the host's python3
// through the run launcher twice, as a cold run runs it (testdata/
// split_check.py): as it is, and with split() answering None, so that
// program()'s way alone runs it. Both must give the same output,
// traceback, display channel and exit status; split() must take the cases
// it is meant to take (the fast way is the one a cold run gets), and each
// must show what it is meant to. A few run again with a trace function
// set, where split() compiles with compile().
func TestSplitSameAsProgram(t *testing.T) {
	// The interpreter itself, not a shim that finds it at each start.
	b, err := exec.Command("python3", "-c", "import sys; print(sys.executable)").Output()
	if err != nil {
		t.Fatalf("python3 is needed (Debian's python3): %v", err)
	}
	py := strings.TrimSpace(string(b))
	check, err := filepath.Abs("testdata/split_check.py")
	if err != nil {
		t.Fatal(err)
	}
	run, _ := filepath.Abs("agentrun_run.py")
	runlib, _ := filepath.Abs("agentrun_runlib.py")
	dir := t.TempDir()
	file := filepath.Join(dir, "main.py")
	out := filepath.Join(dir, "out")
	type outcome struct{ stdout, stderr, channel, split string }
	runAs := func(t *testing.T, c splitCase, mode string, env ...string) (outcome, int) {
		if err := os.RemoveAll(out); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(out, 0o700); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(py, append([]string{"-u", check, file}, c.args...)...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "CHECK_RUN="+run, "CHECK_RUNLIB="+runlib, "CHECK_OUT="+out, "CHECK_MODE="+mode)
		cmd.Env = append(cmd.Env, env...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		status := 0
		if err := cmd.Run(); err != nil {
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("%s: %v", mode, err)
			}
			status = exit.ExitCode()
		}
		channel, _ := os.ReadFile(filepath.Join(out, "bundles"))
		split, err := os.ReadFile(filepath.Join(out, "split"))
		if err != nil {
			t.Fatalf("%s: the launcher never asked split() (stderr %q)", mode, stderr.String())
		}
		return outcome{stdout.String(), stderr.String(), string(channel), string(split)}, status
	}
	for _, c := range splitCases {
		t.Run(c.name, func(t *testing.T) {
			if err := os.WriteFile(file, []byte(c.code), 0o600); err != nil {
				t.Fatal(err)
			}
			fast, fastStatus := runAs(t, c, "split")
			ref, refStatus := runAs(t, c, "program")
			if want := map[bool]string{true: "yes", false: "no"}[c.fast]; fast.split != want {
				t.Errorf("split() taken: %s; want %s", fast.split, want)
			}
			if fast.stdout != ref.stdout || fast.stderr != ref.stderr || fast.channel != ref.channel || fastStatus != refStatus {
				t.Errorf("split()'s way differs from program()'s:\nstdout %q\n  want %q\nstderr %q\n  want %q\nchannel %q\n  want %q\nstatus %d; want %d",
					fast.stdout, ref.stdout, fast.stderr, ref.stderr, fast.channel, ref.channel, fastStatus, refStatus)
			}
			if traced[c.name] {
				// With a trace function set, split() compiles with
				// compile(), and leaves the trace function as it is.
				got, status := runAs(t, c, "split", "CHECK_TRACE=1")
				want, wantStatus := runAs(t, c, "program", "CHECK_TRACE=1")
				got.split, want.split = "", ""
				if got != want || status != wantStatus {
					t.Errorf("with a trace function set, split()'s way differs from program()'s:\n%+v (%d)\nwant %+v (%d)", got, status, want, wantStatus)
				}
			}
			all := ref.stdout + ref.stderr + ref.channel
			for _, w := range c.want {
				if !strings.Contains(all, w) {
					t.Errorf("the run shows no %q:\nstdout %q\nstderr %q\nchannel %q", w, ref.stdout, ref.stderr, ref.channel)
				}
			}
		})
	}
}
