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
// the result. Without a terminal the request is denied.
func TestRunAsksOnTerminal(t *testing.T) {
	in := proxytest.NewInternet(t)
	cfg, up := serviceServeConfig(t, in, "20s")
	delete(cfg, "server")
	cfgPath := writeConfig(t, cfg)
	task, _ := json.Marshal(map[string]any{
		"code":    postPy + `print(post("/api/write/3", "three"))`,
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
	var seen strings.Builder
	buf := make([]byte, 4096)
	m.SetReadDeadline(time.Now().Add(30 * time.Second))
	for !strings.Contains(seen.String(), "Approve? [y/N] ") {
		n, err := m.Read(buf)
		if err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("no question on the terminal: %v; got %q", err, seen.String())
		}
		seen.Write(buf[:n])
	}
	if !strings.Contains(seen.String(), "POST https://api.internet.test/api/write/3") {
		t.Errorf("question %q", seen.String())
	}
	m.Write([]byte("y\n"))
	cmd.Wait()
	var res result.Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("result %q: %v", out.String(), err)
	}
	if res.Stdout != "200 api POST /api/write/3 three\n" {
		t.Errorf("stdout %q; want the upstream's answer", res.Stdout)
	}
	if a := res.Network.Approvals; len(a) != 1 || !a[0].Approved || a[0].By != "terminal" {
		t.Errorf("approvals %+v", a)
	}

	// No terminal: denied.
	cmd = exec.Command(agentrunBin(t), "run", "--config", cfgPath, taskPath)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	b, _ := cmd.Output()
	res = result.Result{}
	json.Unmarshal(b, &res)
	if res.Stdout != "403 agentrun: denied by the operator\n" || len(res.Network.Approvals) != 1 || res.Network.Approvals[0].By != "no way to ask" {
		t.Errorf("without a terminal: stdout %q, approvals %+v", res.Stdout, res.Network.Approvals)
	}
	if got := up.Got(); len(got) != 1 {
		t.Errorf("upstream got %d requests; want 1", len(got))
	}
	assertNoLeaks(t)
}
