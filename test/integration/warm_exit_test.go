package integration

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/internal/runapi"
)

// failingStdout is a stream whose flush fails, with a repr that names no
// address, so that the interpreter's report of it is the same in every run.
const failingStdout = `import sys
class W:
    def write(self, s): return len(s)
    def flush(self): raise OSError("no flush")
    def __repr__(self): return "<W>"
`

// warmExitCases are endings of a program whose exit status and output a
// warm run must give as the interpreter's own end does in a cold one
// (_Py_HandleSystemExit, _PyErr_PrintEx, Py_FinalizeEx).
var warmExitCases = []struct{ name, code string }{
	// SystemExit's code: an int is read as a C long, then as exit's byte.
	{"int-2**64", "import sys\nsys.exit(2**64)"},
	{"int-2**63", "import sys\nsys.exit(2**63)"},
	{"int-minus-2**63", "import sys\nsys.exit(-2**63)"},
	{"int-2**31", "import sys\nsys.exit(2**31)"},
	{"int-2**31-1", "import sys\nsys.exit(2**31 - 1)"},
	{"int-256", "import sys\nsys.exit(256)"},
	{"int-true", "import sys\nsys.exit(True)"},
	{"int-subclass", "import sys\nclass I(int):\n    def __index__(self): return 8\n    def __int__(self): return 9\n    def __and__(self, o): return 7\nsys.exit(I(4))"},
	{"none", "import sys\nsys.exit(None)"},
	{"float", "import sys\nsys.exit(3.5)"},
	{"str", "import sys\nsys.exit('msg')"},
	{"str-raises", "import sys\nclass B:\n    def __str__(self): raise ValueError('bad str')\nsys.exit(B())"},
	{"code-raises", "class E(SystemExit):\n    @property\n    def code(self): raise ValueError('no code')\n    def __str__(self): return 'E str'\nraise E(4)"},
	{"str-stderr-closed", "import sys\nsys.stderr.close()\nsys.exit('msg')"},
	{"str-stderr-none", "import sys\nsys.stderr = None\nsys.exit('m\\u00e9\\udcff')"},
	{"str-no-stderr", "import sys\ndel sys.stderr\nsys.exit('msg')"},
	// The end's flush: a closed stream is not flushed, a failed flush is 120.
	{"stdout-closed", "import sys\nprint('x')\nsys.stdout.close()"},
	{"stdout-closed-exit", "import sys\nsys.stdout.close()\nsys.exit(3)"},
	{"stderr-closed", "import sys\nsys.stderr.close()"},
	{"stdout-replaced", "import sys, io\nprint('hello')\nsys.stdout = io.StringIO()"},
	{"flush-fails", failingStdout + "sys.stdout = W()"},
	{"flush-fails-exit", failingStdout + "sys.stdout = W()\nsys.exit(3)"},
	{"flush-fails-raise", failingStdout + "sys.stdout = W()\nraise ValueError('v')"},
	{"flush-fails-stderr", failingStdout + "sys.stderr = W()"},
	{"flush-fails-keyboard", failingStdout + "sys.stdout = W()\nraise KeyboardInterrupt"},
	{"flush-fails-hook", failingStdout + "sys.stdout = W()\nsys.unraisablehook = lambda a: print('hook', a.exc_type.__name__, a.err_msg, a.object, file=sys.stderr)"},
	{"flush-fails-hook-raises", failingStdout + "sys.stdout = W()\nclass H:\n    def __call__(self, a): raise KeyError('hk')\n    def __repr__(self): return '<H>'\nsys.unraisablehook = H()"},
	// Uncaught exceptions and sys.excepthook.
	{"keyboard-subclass", "class K(KeyboardInterrupt): pass\nraise K"},
	{"hook-raises", "import sys\ndef h(t, v, tb):\n    raise ValueError('in hook')\nsys.excepthook = h\nraise RuntimeError('orig')"},
	{"hook-sees-no-exception", "import sys\ndef h(t, v, tb):\n    print(sys.exc_info())\n    raise ValueError('in hook')\nsys.excepthook = h\nraise RuntimeError('orig')"},
	{"hook-none", "import sys\nsys.excepthook = None\nraise RuntimeError('orig')"},
	{"hook-missing", "import sys\ndel sys.excepthook\nraise RuntimeError('orig')"},
	{"hook-exits", "import sys\ndef h(t, v, tb):\n    sys.exit(7)\nsys.excepthook = h\nraise RuntimeError('orig')"},
	{"hook-exits-keyboard", "import sys\ndef h(t, v, tb):\n    sys.exit('from hook')\nsys.excepthook = h\nraise KeyboardInterrupt"},
	{"last-vars", "import sys, atexit\natexit.register(lambda: print(sys.last_type.__name__, sys.last_value, sys.last_traceback.tb_frame.f_code.co_filename))\nraise LookupError('l')"},
	// The end after the code: atexit handlers see no exception being
	// handled, and the report of one's exception names no frame under it;
	// an exception in the threads' join is reported, not lost.
	{"atexit-after-exit", "import atexit, sys\natexit.register(lambda: print(sys.exc_info()))\nsys.exit(4)"},
	{"atexit-after-raise", "import atexit, sys\natexit.register(lambda: print(sys.exc_info()))\n1/0"},
	{"atexit-c-raises", "import atexit, os\natexit.register(os.remove, '/nonexistent')"},
	{"atexit-c-raises-hook", "import atexit, os, sys\nsys.unraisablehook = lambda a: print('hook', a.exc_type.__name__, a.exc_traceback, a.err_msg, a.object, file=sys.stderr)\natexit.register(os.remove, '/nonexistent')"},
	{"atexit-exits", "import atexit, sys\natexit.register(sys.exit, 5)"},
	{"join-interrupted", `import _thread, sys, threading, time
main = threading.main_thread().ident
def f():
    # Until the main thread waits in the interpreter's join of this one.
    while sys._current_frames()[main].f_code.co_name != "_shutdown":
        time.sleep(0.01)
    _thread.interrupt_main()
threading.Thread(target=f).start()`},
}

// TestWarmExitsAsCold: each way a program ends gives the same exit
// status, stdout and stderr warm as cold.
func TestWarmExitsAsCold(t *testing.T) {
	p := newWarm(t, pythonImage, 2, nil, pyTask("pass", nil), true)
	for _, tc := range warmExitCases {
		t.Run(tc.name, func(t *testing.T) {
			taskJSON := pyTask(tc.code, nil)
			cold := runOnly(t, testConfig(t), nil, taskJSON)
			warm := p.run(taskJSON, true)
			if st := warmState(p, pythonImage); st != runapi.WarmOK {
				t.Fatalf("warm state %q after the run; want %q", st, runapi.WarmOK)
			}
			if diff := outcomeDiff(cold, warm); diff != "" {
				t.Errorf("warm run differs from the cold one:\n%s", diff)
			}
			p.waitReady(2)
		})
	}
}

// TestColdLauncherExitsAsPlain: through agentrun's run launcher
// (agentrun_run.py, which every cold run of Python code goes through),
// each way a program ends gives the exit status, stdout and stderr of
// python3 run on the file itself.
func TestColdLauncherExitsAsPlain(t *testing.T) {
	for _, tc := range warmExitCases {
		t.Run(tc.name, func(t *testing.T) {
			viaLauncher := runOnly(t, testConfig(t), nil, pyTask(tc.code, nil))
			b, _ := json.Marshal(map[string]any{"command": []string{"python3", "/workspace/plain.py"},
				"files": map[string]any{"plain.py": map[string]string{"content": tc.code}}})
			plain := runOnly(t, testConfig(t), nil, string(b))
			plain.Stdout = strings.ReplaceAll(plain.Stdout, "plain.py", "main.py")
			plain.Stderr = strings.ReplaceAll(plain.Stderr, "plain.py", "main.py")
			plain.StdoutBytes, plain.StderrBytes = int64(len(plain.Stdout)), int64(len(plain.Stderr))
			viaLauncher.StdoutBytes, viaLauncher.StderrBytes = int64(len(viaLauncher.Stdout)), int64(len(viaLauncher.Stderr))
			if diff := outcomeDiff(plain, viaLauncher); diff != "" {
				t.Errorf("the launcher's run differs from the plain one:\n%s", diff)
			}
		})
	}
}
