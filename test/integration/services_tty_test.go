package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/proxy/proxytest"
)

// openPTY returns a pseudo-terminal's master and its slave.
func openPTY(t *testing.T) (*os.File, *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(); s.Close() })
	return m, s
}

// TestRunAsksOnTerminal: agentrun run with a controlling terminal asks
// there about a held request; "y" lets it through, and the decision is in
// the result. A hostile body is shown escaped, in agentrun's lines: none of
// the program's bytes draws anything but itself. Without a terminal the
// request is denied.
func TestRunAsksOnTerminal(t *testing.T) {
	in := proxytest.NewInternet(t)
	cfg, up := serviceServeConfig(t, in, "20s")
	delete(cfg, "server")
	cfgPath := writeConfig(t, cfg)
	task, _ := json.Marshal(map[string]any{
		"code":    hostilePy + `print(post("/api/write/3", "three")); print(postb("/api/write/4", HOSTILE))`,
		"network": map[string]any{"services": []string{"api"}},
		"limits":  map[string]any{"timeout": "30s"},
	})
	taskPath := filepath.Join(t.TempDir(), "task.json")
	os.WriteFile(taskPath, task, 0o600)

	m, s := openPTY(t)
	cmd := exec.Command(agentrunBin(t), "run", "--config", cfgPath, taskPath)
	var out bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = s, &out, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// question reads the terminal up to the next question's prompt and
	// returns what came since the last one.
	var seen strings.Builder
	question := func() string {
		t.Helper()
		buf := make([]byte, 4096)
		m.SetReadDeadline(time.Now().Add(30 * time.Second))
		for !strings.HasSuffix(seen.String(), "Approve? [y/N] ") {
			n, err := m.Read(buf)
			if err != nil {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("no question on the terminal: %v; got %q", err, seen.String())
			}
			seen.Write(buf[:n])
		}
		q := seen.String()
		seen.Reset()
		return q
	}
	if q := question(); !strings.Contains(q, "POST https://api.internet.test/api/write/3") {
		t.Errorf("question %q", q)
	}
	m.Write([]byte("y\n"))
	q := question()
	lines := strings.Split(strings.TrimSpace(strings.ReplaceAll(q, "\r\n", "\n")), "\n")
	for _, l := range lines {
		if bad := proxytest.Unshowable(l); bad != "" {
			t.Errorf("terminal line %q holds %s", l, bad)
		}
	}
	if n := len(lines); n < 3 || lines[n-2] != "  body: "+hostileShown || lines[n-1] != "Approve? [y/N]" || !strings.Contains(lines[n-4], "the sandboxed program asks to send this request") {
		t.Errorf("question about a hostile body:\n%s", q)
	}
	m.Write([]byte("y\n"))
	cmd.Wait()
	var res result.Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("result %q: %v", out.String(), err)
	}
	if res.Stdout != "200 api POST /api/write/3 three\n200\n" {
		t.Errorf("stdout %q; want the upstream's answers", res.Stdout)
	}
	if a := res.Network.Approvals; len(a) != 2 || !a[0].Approved || a[0].By != "terminal" || !a[1].Approved {
		t.Errorf("approvals %+v", a)
	}

	// No terminal: denied.
	cmd = exec.Command(agentrunBin(t), "run", "--config", cfgPath, taskPath)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	b, _ := cmd.Output()
	res = result.Result{}
	json.Unmarshal(b, &res)
	if res.Stdout != "403 agentrun: denied by the operator\n403 agentrun: denied by the operator\n" || len(res.Network.Approvals) != 2 || res.Network.Approvals[0].By != "no way to ask" {
		t.Errorf("without a terminal: stdout %q, approvals %+v", res.Stdout, res.Network.Approvals)
	}
	if got := up.Got(); len(got) != 2 {
		t.Errorf("upstream got %d requests; want 2", len(got))
	}
	assertNoLeaks(t)
}
