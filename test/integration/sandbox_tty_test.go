package integration

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/runapi"
)

// ttyOut runs body's process, which has a tty, to its end over s's API
// and returns what its terminal printed and its exit event; output on
// stdout or stderr is an error (a terminal's output is all "pty").
func ttyOut(t *testing.T, s *served, id, body string) (string, runapi.ProcessEvent) {
	t.Helper()
	outs, exit := execOutputs(t, s, id, body)
	if outs["stdout"] != "" || outs["stderr"] != "" {
		t.Errorf("%s: stdout or stderr from a process with a tty: %q", body, outs)
	}
	return outs["pty"], exit
}

// TestServeLiveSandboxTTY: a process started with a tty has a
// pseudo-terminal of the sandbox's own devpts as its stdio, of the size
// asked; a resize changes it as the process sees it; what is typed is
// echoed by the terminal and read by the shell, Ctrl-D ends it; and it
// is an exec like any other: the sandbox's uid, no_new_privs, no
// capabilities, the sandbox's seccomp filter.
//
// On runsc the terminal is one made on the host whose other end runsc
// exec donates to the sandbox: ttyname does not name it, and gVisor's
// status has no count of filters (the escape battery's runsc-live proves
// the filter).
func TestServeLiveSandboxTTY(t *testing.T) { eachRuntime(t, testServeLiveSandboxTTY) }

func testServeLiveSandboxTTY(t *testing.T, rt string) {
	cfg := serveConfig(map[string]any{"listen": "unix://" + filepath.Join(t.TempDir(), "tty.sock")},
		map[string]any{"local_images": []string{*imagesDir}})
	cfg["runtime"] = rt
	runsc := rt == config.RuntimeRunsc
	s := startServeWith(t, cfg)
	a := createSandbox(t, s)
	sb := "/v1/sandboxes/" + a.ID

	out, exit := ttyOut(t, s, a.ID, `{"cmd": "tty; stty size; test -t 0 && test -t 1 && test -t 2 && echo all-tty", "tty": {"rows": 31, "cols": 97}}`)
	if !runsc && !regexp.MustCompile(`(?m)^/dev/pts/[0-9]+\r$`).MatchString(out) || !strings.Contains(out, "31 97\r\n") ||
		!strings.Contains(out, "all-tty") || *exit.ExitCode != 0 {
		t.Errorf("tty; stty size in a terminal of 31x97: %q, exit %+v", out, exit)
	}
	// Without one, no terminal.
	if out, _ := execOut(t, s, a.ID, `{"cmd": "tty; test -t 0 || test -t 1 || echo no-tty"}`); strings.Contains(out, "/dev/pts") || !strings.Contains(out, "no-tty") {
		t.Errorf("a process without tty has one: %q", out)
	}

	// An exec as any other: its uid, no privilege, the sandbox's filter.
	status, _ := ttyOut(t, s, a.ID, `{"cmd": "id -u; cat /proc/self/status", "tty": {"rows": 24, "cols": 80}}`)
	uidLine, _, _ := strings.Cut(status, "\r\n")
	uid, err := strconv.ParseInt(uidLine, 10, 64)
	if err != nil || uid == 0 || !scope.HasUID(uid) {
		t.Errorf("id -u in a terminal: %q: not one of the sandboxes' uids", uidLine)
	}
	status = strings.ReplaceAll(status, "\r\n", "\n")
	for _, want := range []string{"NoNewPrivs:\t1", "Seccomp:\t2", "CapEff:\t0000000000000000",
		"CapPrm:\t0000000000000000", "CapBnd:\t0000000000000000"} {
		if !strings.Contains(status, want+"\n") {
			t.Errorf("a tty process's status lacks %q:\n%s", want, status)
		}
	}
	initStatus, _ := execOut(t, s, a.ID, `{"cmd": "cat /proc/1/status"}`)
	if f, g := filters(status), filters(initStatus); !runsc && (f == "" || f != g) {
		t.Errorf("a tty process has %q seccomp filters, the sandbox's init %q", f, g)
	}

	// An interactive shell: typed lines echoed and run, a resize seen, a
	// typed ^C interrupts its foreground job (the terminal's signal: on
	// runsc forwarded by runsc exec, its session's leader), Ctrl-D
	// (stdin's close) ends it.
	resp, b := s.do("POST", sb+"/processes?wait=false", `{"command": ["/bin/sh"], "tty": {"rows": 24, "cols": 80}}`)
	var started struct{ Pid int }
	if err := json.Unmarshal(b, &started); resp.StatusCode != 200 || err != nil || started.Pid <= 0 {
		t.Fatalf("a shell with a tty: %d %s", resp.StatusCode, b)
	}
	proc := fmt.Sprintf("%s/processes/%d", sb, started.Pid)
	var list struct{ Processes []runapi.ProcessInfo }
	if s.get(sb+"/processes", &list); len(list.Processes) == 0 || !list.Processes[len(list.Processes)-1].TTY {
		t.Errorf("the shell is not listed with its tty: %+v", list.Processes)
	}
	type step struct{ after, typed string }
	steps := []step{
		{"", "stty size\n"},
		{"24 80\r\n", ""}, // then resized
		{"", "stty size\n"},
		{"50 120\r\n", "echo $((6*7))\n"},
		// The job prints once it is the terminal's foreground.
		{"\r\n42\r\n/workspace $ ", "sh -c 'echo sl\"\"eeping; exec sleep 60'\n"},
		{"sleeping\r\n", "\x03"}, // ^C interrupts the foreground job
		{"^C", "echo after-$?\n"},
		{"after-130\r\n/workspace $ ", ""}, // at the prompt, Ctrl-D
	}
	send := func(data string) {
		body, _ := json.Marshal(map[string]string{"data": data})
		if resp, b := s.do("POST", proc+"/stdin", string(body)); resp.StatusCode != 204 {
			t.Errorf("stdin %q: %d %s", data, resp.StatusCode, b)
		}
	}
	var printed strings.Builder
	i := 0
	evs := sandboxStream(t, s, "GET", proc+"/events", "", func(ev runapi.ProcessEvent) bool {
		printed.WriteString(ev.Data)
		for i < len(steps) && strings.Contains(printed.String(), steps[i].after) {
			st := steps[i]
			i++
			switch {
			case st.typed != "":
				send(st.typed)
			case i == 2:
				if resp, b := s.do("POST", proc+"/resize", `{"rows": 50, "cols": 120}`); resp.StatusCode != 204 {
					t.Errorf("resize: %d %s", resp.StatusCode, b)
				}
			default:
				if resp, b := s.do("POST", proc+"/stdin", `{"close": true}`); resp.StatusCode != 204 {
					t.Errorf("stdin close: %d %s", resp.StatusCode, b)
				}
			}
		}
		return true
	})
	last := evs[len(evs)-1]
	if i != len(steps) || !strings.Contains(printed.String(), "echo $((6*7))\r\n") || last.Event != "exit" || last.ExitCode == nil || *last.ExitCode != 0 {
		t.Errorf("the shell: %d of %d steps, printed %q, last %+v", i, len(steps), printed.String(), last)
	}

	// Bounds and refusals.
	for _, c := range []struct{ path, body, field string }{
		{sb + "/processes", `{"cmd": "true", "tty": {"rows": 0, "cols": 80}}`, "tty.rows"},
		{sb + "/processes", `{"cmd": "true", "tty": {"rows": 24, "cols": 1001}}`, "tty.cols"},
		{proc + "/resize", `{"rows": 24, "cols": 0}`, "cols"},
	} {
		resp, b := s.do("POST", c.path, c.body)
		var e struct{ Field string }
		if json.Unmarshal(b, &e); resp.StatusCode != 400 || e.Field != c.field {
			t.Errorf("POST %s %s: %d %s; want 400 naming %s", c.path, c.body, resp.StatusCode, b, c.field)
		}
	}
	if resp, _ := s.do("POST", proc+"/resize", `{"rows": 5, "cols": 5}`); resp.StatusCode != 409 {
		t.Errorf("resizing an ended process: %d, want 409", resp.StatusCode)
	}
	resp, b = s.do("POST", sb+"/processes?wait=false", `{"cmd": "sleep 60"}`)
	if err := json.Unmarshal(b, &started); resp.StatusCode != 200 || err != nil {
		t.Fatalf("sleep 60: %d %s", resp.StatusCode, b)
	}
	if resp, _ := s.do("POST", fmt.Sprintf("%s/processes/%d/resize", sb, started.Pid), `{"rows": 5, "cols": 5}`); resp.StatusCode != 409 {
		t.Errorf("resizing a process without a tty: %d, want 409", resp.StatusCode)
	}

	if resp, b := s.do("DELETE", sb, ""); resp.StatusCode != 204 {
		t.Fatalf("DELETE: %d %s", resp.StatusCode, b)
	}
	assertNoLeaks(t)
	s.stop()
}
