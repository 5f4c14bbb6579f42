package integration

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/runapi"
)

// sandboxCLI runs `agentrun sandbox --server addr args...` and returns
// its stdout, stderr and exit status.
func sandboxCLI(t *testing.T, addr string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, agentrunBin(t), append([]string{"sandbox", "--server", addr}, args...)...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("agentrun sandbox %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return out.String(), errOut.String(), code
}

// TestSandboxCLI: `agentrun sandbox` makes a live sandbox on serve, runs
// a command in it (its output and exit status), lists and signals its
// processes, and removes it, leaving nothing on the host.
func TestSandboxCLI(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "cli.sock")
	s := startServeWith(t, serveConfig(map[string]any{"listen": "unix://" + sock},
		map[string]any{"local_images": []string{*imagesDir}}))
	addr := "unix://" + sock

	out, errOut, code := sandboxCLI(t, addr, "create", "--image", busyboxImage, "--timeout", "2m")
	id := strings.TrimSpace(out)
	if code != 0 || !regexp.MustCompile(`^sb-[0-9a-f]{32}$`).MatchString(id) {
		t.Fatalf("sandbox create: %d %q %s", code, out, errOut)
	}
	if out, errOut, code := sandboxCLI(t, addr, "exec", id, "--", "echo", "hi"); code != 0 || out != "hi\n" {
		t.Errorf("sandbox exec echo hi: %d %q %s", code, out, errOut)
	}
	if out, errOut, code := sandboxCLI(t, addr, "exec", id, "--", "sh", "-c", "echo err >&2; exit 3"); code != 3 || out != "" || errOut != "err\n" {
		t.Errorf("sandbox exec exit 3: %d %q %q", code, out, errOut)
	}
	if _, errOut, code := sandboxCLI(t, addr, "exec", "sb-"+strings.Repeat("0", 32), "--", "true"); code != 125 || !strings.Contains(errOut, "404") {
		t.Errorf("sandbox exec in a forged id: %d %s", code, errOut)
	}

	// A background process: listed, killed, listed as ended.
	resp, b := s.do("POST", "/v1/sandboxes/"+id+"/processes?wait=false", `{"command": ["sleep", "600"]}`)
	var started struct{ Pid int }
	if err := json.Unmarshal(b, &started); resp.StatusCode != 200 || err != nil {
		t.Fatalf("sleep 600: %d %s", resp.StatusCode, b)
	}
	pid := strconv.Itoa(started.Pid)
	if out, errOut, code := sandboxCLI(t, addr, "ps", id); code != 0 || !regexp.MustCompile(`(?m)^ *`+pid+` +running .* sleep 600$`).MatchString(out) {
		t.Errorf("sandbox ps: %d %q %s", code, out, errOut)
	}
	if out, errOut, code := sandboxCLI(t, addr, "kill", "--signal", "SIGKILL", id, pid); code != 0 {
		t.Errorf("sandbox kill: %d %q %s", code, out, errOut)
	}
	ended := false
	for deadline := time.Now().Add(30 * time.Second); !ended && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		out, _, _ := sandboxCLI(t, addr, "--json", "ps", id)
		var list []runapi.ProcessInfo
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("sandbox --json ps: %q: %v", out, err)
		}
		for _, p := range list {
			ended = ended || (strconv.Itoa(p.Pid) == pid && !p.Running && p.ExitCode != nil && *p.ExitCode == 137)
		}
	}
	if !ended {
		t.Errorf("the killed process is not listed as ended by SIGKILL")
	}
	if out, _, code := sandboxCLI(t, addr, "ls"); code != 0 || !strings.HasPrefix(out, id+" ") {
		t.Errorf("sandbox ls: %d %q", code, out)
	}

	if out, errOut, code := sandboxCLI(t, addr, "rm", id); code != 0 {
		t.Errorf("sandbox rm: %d %q %s", code, out, errOut)
	}
	if out, _, code := sandboxCLI(t, addr, "ls"); code != 0 || out != "" {
		t.Errorf("sandbox ls after rm: %d %q", code, out)
	}
	if _, errOut, code := sandboxCLI(t, addr, "rm", id); code != 1 || !strings.Contains(errOut, "404") {
		t.Errorf("sandbox rm again: %d %s", code, errOut)
	}
	assertNoLeaks(t)
	s.stop()
}

// tmuxSession is a terminal that tmux runs a command in, on a server of
// the test's own (its socket in a temporary dir).
type tmuxSession struct {
	t    *testing.T
	sock string
}

func (m tmuxSession) tmux(args ...string) string {
	m.t.Helper()
	out, err := exec.Command("tmux", append([]string{"-S", m.sock}, args...)...).CombinedOutput()
	if err != nil {
		m.t.Fatalf("tmux %v: %v: %s", args, err, out)
	}
	return string(out)
}

// waitScreen waits until the screen matches re, and returns it.
func (m tmuxSession) waitScreen(re string) string {
	m.t.Helper()
	rx := regexp.MustCompile(re)
	var screen string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if screen = m.tmux("capture-pane", "-p", "-t", "sh"); rx.MatchString(screen) {
			return screen
		}
	}
	m.t.Fatalf("the terminal never showed %s:\n%s", re, screen)
	return ""
}

// TestShellCLI: `agentrun shell`, on a real terminal (tmux's), runs an
// interactive shell in a new live sandbox: what is typed runs there, the
// terminal's size follows its window, Ctrl-D ends it, and the sandbox is
// gone with it.
func TestShellCLI(t *testing.T) {
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatalf("tmux (test/deps.sh installs it): %v", err)
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "shell.sock")
	s := startServeWith(t, serveConfig(map[string]any{"listen": "unix://" + sock},
		map[string]any{"local_images": []string{*imagesDir}}))
	m := tmuxSession{t: t, sock: filepath.Join(dir, "tmux.sock")}
	// The command line is tmux's to run by a shell: every word quoted.
	line := strings.Join([]string{shellQuote(agentrunBin(t)), "shell", "--server", shellQuote("unix://" + sock),
		"--image", shellQuote(busyboxImage), "; echo shell-exit:$?; sleep 600"}, " ")
	m.tmux("new-session", "-d", "-s", "sh", "-x", "100", "-y", "30", line)
	t.Cleanup(func() { exec.Command("tmux", "-S", m.sock, "kill-server").Run() })

	m.waitScreen(`(?m)^/workspace \$ ?$`)
	var list struct{ Sandboxes []runapi.SandboxInfo }
	if s.get("/v1/sandboxes", &list); len(list.Sandboxes) != 1 {
		t.Errorf("while the shell runs, sandboxes: %+v", list.Sandboxes)
	}
	m.tmux("send-keys", "-t", "sh", "echo $((6*7)); stty size; tty", "Enter")
	m.waitScreen(`(?m)^42\n30 100\n/dev/pts/[0-9]+\n`)
	m.tmux("resize-window", "-t", "sh", "-x", "120", "-y", "40")
	m.tmux("send-keys", "-t", "sh", "clear; stty size", "Enter")
	m.waitScreen(`(?m)^40 120\n`)
	m.tmux("send-keys", "-t", "sh", "C-d")
	m.waitScreen(`(?m)^shell-exit:0$`)
	if s.get("/v1/sandboxes", &list); len(list.Sandboxes) != 0 {
		t.Errorf("after the shell ended, sandboxes: %+v", list.Sandboxes)
	}
	assertNoLeaks(t)
	s.stop()
}

// shellQuote is s as one word of a POSIX shell's command line.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
