package integration

import (
	"cmp"
	"encoding/base64"
	"encoding/json"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/server"
)

// fakePyplot is a matplotlib.pyplot with what agentrun's launcher uses
// of it (figure, get_fignums, close, show, a figure's savefig): the test
// images have no matplotlib. A figure's PNG is a PNG signature and its
// number; the real show fails, so that only the launcher's may run. A
// figure pickled while open opens itself again, under the next number,
// when unpickled, as matplotlib's does.
const fakePyplot = `import os
_figs = {}
class Figure:
    def __init__(self, num):
        self.num = num
    def savefig(self, f, format=None):
        assert format == "png", format
        f.write(b"\x89PNG\r\n\x1a\n" + b"fig%d" % self.num)
    def __repr__(self):
        return "<Figure %d>" % self.num
    def __getstate__(self):
        return {"num": self.num, "open": _figs.get(self.num) is self}
    def __setstate__(self, state):
        self.num = state["num"]
        if state["open"]:
            self.num = max(_figs, default=0) + 1
            _figs[self.num] = self
def figure(num=None):
    if num is None:
        num = max(_figs, default=0) + 1
    return _figs.setdefault(num, Figure(num))
def get_fignums():
    return sorted(_figs)
def close(which):
    if which == "all":
        _figs.clear()
    else:
        _figs.pop(which, None)
def show():
    raise RuntimeError("the real show ran")
`

// withFakeMatplotlib is extra with the fake matplotlib package among the
// task's files.
func withFakeMatplotlib(extra map[string]any) map[string]any {
	m := map[string]any{"files": map[string]any{
		"matplotlib/__init__.py": map[string]string{"content": ""},
		"matplotlib/pyplot.py":   map[string]string{"content": fakePyplot},
	}}
	for k, v := range extra {
		m[k] = v
	}
	return m
}

func png(s string) string { return base64.StdEncoding.EncodeToString([]byte("\x89PNG\r\n\x1a\n" + s)) }

type bundle = map[string]string

// valueCase is a Python program and the values its result must show.
type valueCase struct {
	code    string
	extra   map[string]any
	stdout  string
	value   bundle
	display []bundle
	dropped int
}

const richClass = `class Rich:
    def __repr__(self): return "Rich()"
    def _repr_html_(self): return "<b>rich</b>"
    def _repr_markdown_(self): return "**rich**"
    def _repr_png_(self): return b"\x89PNG\r\n\x1a\nrich"
    def _repr_json_(self): return {"a": [1, 2]}
    def _repr_latex_(self): raise ValueError("no latex")
class Bundled:
    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/plain": "bundled", "image/svg+xml": "<svg/>", "x/unknown": "dropped"}
`

// hostileChannel writes into the display channel what no launcher writes.
const hostileChannel = `import os
with open("/dev/agentrun-display/bundles", "ab") as f:
    f.write(b"not json\n")
    f.write(b'{"display": {"text/plain": 5}}\n')
    f.write(b'{"display": {"x/evil": "a"}}\n')
    f.write(b'{"value": {"image/png": "!!!"}}\n')
    f.write(b'{"display": {}, "value": {}}\n')
    f.write(b'[1, 2]\n')
    f.write(b'{"display": {"text/plain": "ok"}}\n')
    f.write(b"\xff\xfe\x00\n")
    f.write(b'{"display": {"text/plain": "cut')
print("wrote")
`

var valueCases = map[string]valueCase{
	"int":       {code: "x = 6\nx * 7", value: bundle{"text/plain": "42"}},
	"str":       {code: "'a' + 'b'", value: bundle{"text/plain": "'ab'"}},
	"none":      {code: "print('hi')", stdout: "hi\n"},
	"none-expr": {code: "None"},
	"no-expr":   {code: "x = 1"},
	"rich": {code: richClass + "Rich()", value: bundle{"text/plain": "Rich()", "text/html": "<b>rich</b>",
		"text/markdown": "**rich**", "image/png": png("rich"), "application/json": `{"a": [1, 2]}`}},
	"mimebundle": {code: richClass + "Bundled()", value: bundle{"text/plain": "bundled", "image/svg+xml": "<svg/>"}},
	"display-order": {code: richClass + "display(1)\nprint('between')\ndisplay('two', Rich())\n3",
		stdout: "between\n", value: bundle{"text/plain": "3"},
		display: []bundle{{"text/plain": "1"}, {"text/plain": "'two'"}, {"text/plain": "Rich()", "text/html": "<b>rich</b>",
			"text/markdown": "**rich**", "image/png": png("rich"), "application/json": `{"a": [1, 2]}`}}},
	// A figure shown comes when shown (and is closed); one left open, at
	// the end; matplotlib gets Agg without asking, and is not imported
	// unless the program does.
	"figures": {code: "import os, sys\nprint(os.environ['MPLBACKEND'], 'matplotlib' in sys.modules)\nimport matplotlib.pyplot as plt\n" +
		"plt.figure()\ndisplay('between')\nplt.show()\nplt.figure()\nplt.figure()\n'end'",
		extra: withFakeMatplotlib(nil), stdout: "Agg False\n", value: bundle{"text/plain": "'end'"},
		display: []bundle{{"text/plain": "'between'"}, {"text/plain": "<Figure 1>", "image/png": png("fig1")},
			{"text/plain": "<Figure 1>", "image/png": png("fig1")}, {"text/plain": "<Figure 2>", "image/png": png("fig2")}}},
	"figure-value": {code: "import matplotlib.pyplot as plt\nplt.figure()", extra: withFakeMatplotlib(nil),
		value: bundle{"text/plain": "<Figure 1>", "image/png": png("fig1")}},
	"mplbackend-kept": {code: "import os\nos.environ['MPLBACKEND']", extra: map[string]any{"env": map[string]string{"MPLBACKEND": "svg"}},
		value: bundle{"text/plain": "'svg'"}},
	"cap-16": {code: "for i in range(20):\n    display(i)", dropped: 4,
		display: func() []bundle {
			var b []bundle
			for i := range 16 {
				b = append(b, bundle{"text/plain": itoa(i)})
			}
			return b
		}()},
	// output_bytes 4000: the value, then the first display fit; the
	// second is dropped, the third fits in what is left.
	"size-drop": {code: "display('x' * 3000)\ndisplay('y' * 3000)\ndisplay('z')\n'ok'",
		extra: map[string]any{"limits": map[string]any{"output_bytes": 4000}}, value: bundle{"text/plain": "'ok'"}, dropped: 1,
		display: []bundle{{"text/plain": "'" + strings.Repeat("x", 3000) + "'"}, {"text/plain": "'z'"}}},
	"hostile": {code: hostileChannel, stdout: "wrote\n", dropped: 8, display: []bundle{{"text/plain": "ok"}}},
	"symlink": {code: "import os\nos.symlink('/etc/shadow', '/dev/agentrun-display/bundles')\ndisplay(1)\n2"},
	"fifo":    {code: "import os\nos.mkfifo('/dev/agentrun-display/bundles')\ndisplay(1)\nprint('made')", stdout: "made\n"},
	"raises":  {code: "display(1)\nraise ValueError('x')", display: []bundle{{"text/plain": "1"}}},
	"exit":    {code: "import sys\ndisplay(1)\nsys.exit(3)\n4", display: []bundle{{"text/plain": "1"}}},
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// checkValues runs each case with run and checks its values. The cases
// with an env, a task shape of their own, run last: a pool follows the
// shape of its image's last runs, and one of them among the first two
// runs would move it to that shape, so that the next case, expected from
// the pool, ran cold.
func checkValues(t *testing.T, run func(t *testing.T, taskJSON string) *result.Result) {
	names := slices.Sorted(maps.Keys(valueCases))
	slices.SortStableFunc(names, func(a, b string) int {
		_, ea := valueCases[a].extra["env"]
		_, eb := valueCases[b].extra["env"]
		return cmp.Compare(boolInt(ea), boolInt(eb))
	})
	for _, name := range names {
		c := valueCases[name]
		t.Run(name, func(t *testing.T) {
			res := run(t, pyTask(c.code, c.extra))
			if res.Error != "" {
				t.Fatalf("run failed: %s", res.Error)
			}
			if res.Stdout != c.stdout {
				t.Errorf("stdout %q; want %q (stderr %q)", res.Stdout, c.stdout, res.Stderr)
			}
			if !reflect.DeepEqual(res.Value, c.value) {
				t.Errorf("value %q; want %q (stderr %q)", res.Value, c.value, res.Stderr)
			}
			if !reflect.DeepEqual(res.Display, c.display) {
				t.Errorf("display %q; want %q (stderr %q)", res.Display, c.display, res.Stderr)
			}
			if res.DisplayDropped != c.dropped {
				t.Errorf("display_dropped %d; want %d", res.DisplayDropped, c.dropped)
			}
			if _, err := json.Marshal(res); err != nil {
				t.Errorf("result does not encode: %v", err)
			}
		})
	}
}

// TestValuesCold: a cold run's last expression's value, its displays and
// figures come back as MIME bundles, bounded, on both runtimes; what a
// program writes into the channel itself is checked and dropped.
func TestValuesCold(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		checkValues(t, func(t *testing.T, taskJSON string) *result.Result { return runIn(t, rt, taskJSON) })
	})
}

// TestValuesLibraryOnNeed: a cold run loads the launcher's library
// (agentrun_runlib.py) only once something needs it, here display(); a
// program that has replaced the builtins the launcher loads it with still
// gets its value shown.
func TestValuesLibraryOnNeed(t *testing.T) {
	res := runIn(t, "libcontainer", pyTask("import builtins\nns = builtins.display.__globals__\nprint(bool(ns['_lib']))\ndisplay(1)\nprint(bool(ns['_lib']))\n", nil))
	if res.Stdout != "False\nTrue\n" || !reflect.DeepEqual(res.Display, []map[string]string{{"text/plain": "1"}}) {
		t.Errorf("stdout %q, display %q; want the library loaded at display() alone (stderr %q)", res.Stdout, res.Display, res.Stderr)
	}
	res = runIn(t, "libcontainer", pyTask("import builtins\nbuiltins.open = builtins.compile = builtins.exec = None\n6 * 7\n", nil))
	if !reflect.DeepEqual(res.Value, map[string]string{"text/plain": "42"}) {
		t.Errorf("value %q after the builtins were replaced; want 42 (stderr %q)", res.Value, res.Stderr)
	}
}

// TestValuesPooled: the same from a pooled sandbox.
func TestValuesPooled(t *testing.T) {
	p := newPooled(t, 1, pyTask("pass", nil))
	checkValues(t, func(t *testing.T, taskJSON string) *result.Result {
		p.waitReady(1)
		return p.run(taskJSON, !strings.Contains(taskJSON, `"env"`))
	})
}

// TestValuesWarm: the same from a warm sandbox, whose launcher runs the
// code through the run launcher.
func TestValuesWarm(t *testing.T) {
	p := newWarm(t, pythonImage, 1, nil, pyTask("pass", nil), true)
	checkValues(t, func(t *testing.T, taskJSON string) *result.Result {
		p.waitReady(1)
		return p.run(taskJSON, !strings.Contains(taskJSON, `"env"`))
	})
}

// TestValuesLauncherRunsAsPlain: code run through the run launcher gives
// what the interpreter run on the file itself gives (a command on a file
// of another name, which no launcher runs): exit status, signal, output
// and tracebacks, for each of the warm cases.
func TestValuesLauncherRunsAsPlain(t *testing.T) {
	extra := map[string]any{"stdin": "some input\n", "env": map[string]string{"PROBE": "yes"},
		"limits": map[string]any{"output_bytes": 4000}}
	for name, code := range warmCases {
		t.Run(name, func(t *testing.T) {
			withFiles := func(files map[string]any) map[string]any {
				m := map[string]any{"files": files}
				for k, v := range extra {
					m[k] = v
				}
				return m
			}
			data := map[string]string{"content": "data"}
			viaLauncher := runIn(t, "libcontainer", pyTask(code, withFiles(map[string]any{"data.txt": data})))
			plainTask := withFiles(map[string]any{"data.txt": data, "plain.py": map[string]string{"content": code}})
			plainTask["command"] = []string{"python3", "-u", "/workspace/plain.py"}
			b, _ := json.Marshal(plainTask)
			plain := runIn(t, "libcontainer", string(b))
			plain.Stdout = strings.ReplaceAll(plain.Stdout, "plain.py", "main.py")
			plain.Stderr = strings.ReplaceAll(plain.Stderr, "plain.py", "main.py")
			if name == "probe" {
				// What the launcher adds: the modules it imports, its
				// matplotlib default.
				for _, r := range []*result.Result{plain, viaLauncher} {
					r.Stdout = probeLine(r.Stdout, "modules")
					r.Stdout = strings.ReplaceAll(r.Stdout, "'MPLBACKEND', ", "")
				}
			}
			plain.StdoutBytes, plain.StderrBytes = int64(len(plain.Stdout)), int64(len(plain.Stderr))
			viaLauncher.StdoutBytes, viaLauncher.StderrBytes = int64(len(viaLauncher.Stdout)), int64(len(viaLauncher.Stderr))
			if diff := outcomeDiff(plain, viaLauncher); diff != "" {
				t.Errorf("the launcher's run differs from the plain one:\n%s", diff)
			}
		})
	}
}

// probeLine is out without its line that starts with word.
func probeLine(out, word string) string {
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(l, word+" ") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// valuesDoorCode displays a rich object and a figure-like PNG, then ends
// with 42.
const valuesDoorCode = richClass + "display('first', Rich())\n6 * 7"

// TestValuesStream: a streamed run sends each display bundle as a
// "display" event as the program shows it, in order: before the output
// the program writes a while after (it sleeps first), and before the
// result, which has them too.
func TestValuesStream(t *testing.T) {
	s := startServe(t, map[string]any{"listen": "unix://" + filepath.Join(t.TempDir(), "u.sock")})
	code := richClass + "import time\ndisplay('first', Rich())\ntime.sleep(1.5)\nprint('after', flush=True)\n6 * 7"
	body, _ := json.Marshal(map[string]any{"code": code})
	_, b := s.do("POST", "/v1/runs?stream=1", string(body))
	var kinds []string
	var shown []bundle
	var res *result.Result
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var ev server.Event
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		kinds = append(kinds, ev.Event)
		switch ev.Event {
		case "display":
			shown = append(shown, ev.Display)
		case "result":
			res = ev.Result
		}
	}
	if got := strings.Join(kinds, ","); got != "display,display,stdout,result" {
		t.Errorf("events %s; want two displays as they come, the output after them, then the result", got)
	}
	if res == nil || res.Value["text/plain"] != "42" || !reflect.DeepEqual(res.Display, shown) || len(shown) != 2 ||
		shown[0]["text/plain"] != "'first'" || shown[1]["text/html"] != "<b>rich</b>" {
		t.Errorf("displays %q, result %+v", shown, res)
	}
	s.stop()
}

// TestValuesMCP: run_code's answer gives a display's PNG as image content
// and each bundle's value once as text content (its first text type, the
// others named), all of them in structuredContent.
func TestValuesMCP(t *testing.T) {
	cs := inProcessMCP(t, testConfig(t), nil)
	res := call(t, cs, map[string]any{"code": valuesDoorCode})
	if res.IsError {
		t.Fatalf("answer: %q", answerText(t, res))
	}
	var texts []string
	var images int
	for _, c := range res.Content[1:] {
		switch c := c.(type) {
		case *mcp.TextContent:
			texts = append(texts, c.Text)
		case *mcp.ImageContent:
			images++
			if c.MIMEType != "image/png" || string(c.Data) != "\x89PNG\r\n\x1a\nrich" {
				t.Errorf("image %s %q", c.MIMEType, c.Data)
			}
		}
	}
	all := strings.Join(texts, "\n--\n")
	for _, want := range []string{"display 1 (text/plain):\n'first'",
		"display 2 (text/markdown; also text/plain, application/json, text/html in structuredContent):\n**rich**",
		"value (text/plain):\n42"} {
		if !strings.Contains(all, want) {
			t.Errorf("texts %q lack %q", all, want)
		}
	}
	// Each bundle's value is sent once: Rich's markdown, not its HTML or
	// text beside it.
	if strings.Contains(all, "<b>rich</b>") || strings.Contains(all, "Rich()") || len(texts) != 3 {
		t.Errorf("texts %q; want one per bundle", all)
	}
	if images != 1 {
		t.Errorf("%d images; want 1", images)
	}
	if out := structured(t, res); out.Value["text/plain"] != "42" || len(out.Display) != 2 {
		t.Errorf("structured value %q display %d", out.Value, len(out.Display))
	}
	assertNoLeaks(t)
}

// TestValuesPandas: a pandas frame as the last expression gives its
// text/html table beside its text.
func TestValuesPandas(t *testing.T) {
	img := pythonData(t)
	res := runIn(t, "libcontainer", pyTask("import pandas as pd\npd.DataFrame({'a': [1, 2]})", map[string]any{"image": img}))
	if res.Error != "" || !strings.Contains(res.Value["text/html"], "<table") || !strings.Contains(res.Value["text/plain"], "a") {
		t.Errorf("value %q, stderr %q, error %q", res.Value, res.Stderr, res.Error)
	}
}

// matplotlibCode plots with Debian's matplotlib: a figure shown, one left
// open at the end, and a pandas frame as the value.
const matplotlibCode = `import matplotlib, matplotlib.pyplot as plt
import pandas as pd
print(matplotlib.get_backend())
plt.plot([1, 2, 3])
plt.show()
plt.figure()
plt.plot([3, 1])
pd.DataFrame({'a': [1, 2]})
`

// TestValuesMatplotlib: with the real matplotlib (the python-data image),
// cold and warm (pyplot preloaded), a figure shown with plt.show() and
// one still open at the end come back as PNG bundles, under the
// non-interactive backend the launcher picks, and a pandas frame's value
// as its HTML table.
func TestValuesMatplotlib(t *testing.T) {
	ref := pythonData(t)
	extra := map[string]any{"image": ref, "limits": map[string]any{"timeout": "60s", "memory": "512m"}}
	check := func(t *testing.T, res *result.Result) {
		t.Helper()
		if res.Error != "" || res.ExitCode != 0 || res.Stdout != "agg\n" {
			t.Fatalf("exit %d, stdout %q, stderr %q, error %q", res.ExitCode, res.Stdout, res.Stderr, res.Error)
		}
		if len(res.Display) != 2 || res.DisplayDropped != 0 {
			t.Fatalf("%d display bundles (%d dropped); want the shown figure and the open one", len(res.Display), res.DisplayDropped)
		}
		for i, b := range res.Display {
			data, err := base64.StdEncoding.DecodeString(b["image/png"])
			if err != nil || !strings.HasPrefix(string(data), "\x89PNG\r\n\x1a\n") || len(data) < 1000 ||
				!strings.HasPrefix(b["text/plain"], "<Figure size") {
				t.Errorf("display %d: text %q, a PNG of %d bytes (%v)", i, b["text/plain"], len(data), err)
			}
		}
		if !strings.Contains(res.Value["text/html"], "<table") || !strings.Contains(res.Value["text/plain"], "a") {
			t.Errorf("value %q", res.Value)
		}
	}
	t.Run("cold", func(t *testing.T) {
		check(t, runIn(t, "libcontainer", pyTask(matplotlibCode, extra)))
	})
	t.Run("warm", func(t *testing.T) {
		p := newWarm(t, ref, 1, []string{"numpy", "pandas", "matplotlib.pyplot"}, pyTask("pass", extra), true)
		if st := warmState(p, ref); st != "warm" {
			t.Fatalf("warm state %q", st)
		}
		check(t, p.run(pyTask(matplotlibCode, extra), true))
	})
}

// TestValuesRestoredFigureNotShown: a figure left open in a global is
// shown by the call that made it, and not by the later calls of the
// context that restore it (its unpickling opens it again in pyplot): only
// what a call makes, or shows itself, is its output.
func TestValuesRestoredFigureNotShown(t *testing.T) {
	cfg := sessionCfg(t, "libcontainer", "32m")
	r, id := newSession(t, cfg)
	run := func(code string, extra map[string]any) *result.Result {
		t.Helper()
		return runStateful(t, r, cfg, id, code, extra)
	}
	if res := run("import matplotlib.pyplot as plt\nfig = plt.figure()", withFakeMatplotlib(nil)); len(res.Display) != 1 {
		t.Fatalf("the call that made the figure: display %q, state %+v", res.Display, res.State)
	}
	if res := run("1 + 1", nil); len(res.Display) != 0 || res.Value["text/plain"] != "2" {
		t.Errorf("a later call: display %q, value %q; want no figure", res.Display, res.Value)
	}
	if res := run("g = plt.figure()", nil); len(res.Display) != 1 {
		t.Errorf("a call that makes another figure: display %q; want it alone", res.Display)
	}
	if res := run("display(fig)", nil); !reflect.DeepEqual(res.Display, []map[string]string{{"text/plain": "<Figure 1>", "image/png": png("fig1")}}) {
		t.Errorf("a call that shows the restored figure: display %q", res.Display)
	}
}

// TestValuesRestoredFigureNotShownMatplotlib: the same with the real
// matplotlib (the python-data image), whose figures reopen themselves in
// pyplot when unpickled.
func TestValuesRestoredFigureNotShownMatplotlib(t *testing.T) {
	ref := pythonData(t)
	cfg := sessionCfg(t, "libcontainer", "64m")
	r, id := newSession(t, cfg)
	run := func(code string) *result.Result {
		t.Helper()
		return runStateful(t, r, cfg, id, code, map[string]any{"image": ref, "limits": map[string]any{"timeout": "60s", "memory": "512m"}})
	}
	if res := run("import matplotlib.pyplot as plt\nfig = plt.figure()\nplt.plot([1, 2])"); len(res.Display) != 1 || !res.State.Saved || !slices.Contains(res.State.Kept, "fig") {
		t.Fatalf("the call that made the figure: %d display bundles, state %+v", len(res.Display), res.State)
	}
	if res := run("1 + 1"); len(res.Display) != 0 || res.Value["text/plain"] != "2" {
		t.Errorf("a later call: %d display bundles, value %q; want no figure", len(res.Display), res.Value)
	}
	res := run("display(fig)\nprint(len(fig.axes[0].lines))")
	if len(res.Display) != 1 || !strings.HasPrefix(res.Display[0]["text/plain"], "<Figure size") || res.Stdout != "1\n" {
		t.Errorf("a call that shows the restored figure: %d display bundles (%v), stdout %q", len(res.Display), res.Display, res.Stdout)
	}
}
