package launcher

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/internal/safefs"
)

// TestStateModule runs testdata/state_check.py on the host's python3
// against agentrun_state.py: globals of every kind round-trip (functions,
// lambdas, closures and classes by value, modules by name, shared objects
// shared), what cannot be pickled is named, and a state past its cap is
// not kept.
func TestStateModule(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is needed (Debian's python3): %v", err)
	}
	out, err := exec.Command(py, "testdata/state_check.py", "agentrun_state.py").CombinedOutput()
	if err != nil || !strings.HasSuffix(strings.TrimSpace(string(out)), "ok") {
		t.Fatalf("state_check.py: %v\n%s", err, out)
	}
}

// TestReadStateBounded: the launcher's report is the program's words:
// agentrun keeps at most maxStateNames names, each text escaped and cut,
// and a report past maxStateReport, not JSON, or not a regular file reads
// as a state not saved.
func TestReadStateBounded(t *testing.T) {
	dir := t.TempDir()
	report := filepath.Join(dir, stateReportFile)
	write := func(v any) {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(report, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var kept []string
	dropped := map[string]string{}
	for i := range 2 * maxStateNames {
		kept = append(kept, fmt.Sprintf("n%d", i))
		dropped[fmt.Sprintf("d%d", i)] = "x"
	}
	long := "\x1b[31mred\u202e" + strings.Repeat("y", 4*maxStateText)
	dropped[long] = long
	write(map[string]any{"kept": kept, "dropped": dropped, "bytes": 7, "saved": true, "reason": long})
	st := ReadState(openDir(t, dir)).State
	if len(st.Kept) != maxStateNames || len(st.Dropped) != maxStateNames || !st.Saved || st.Bytes != 7 {
		t.Errorf("kept %d, dropped %d, saved %v, bytes %d; want %d names each", len(st.Kept), len(st.Dropped), st.Saved, st.Bytes, maxStateNames)
	}
	if strings.ContainsAny(st.Reason, "\x1b\u202e") || len(st.Reason) > maxStateText+200 || !strings.Contains(st.Reason, `\x1b`) {
		t.Errorf("reason not escaped and cut: %q", st.Reason)
	}

	for name, data := range map[string][]byte{
		"not JSON":  []byte("{kept"),
		"too large": append([]byte(`{"kept": ["`), make([]byte, maxStateReport)...),
		"negative":  []byte(`{"bytes": -1, "saved": true}`),
	} {
		if err := os.WriteFile(report, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if st := ReadState(openDir(t, dir)).State; st.Saved || st.Reason == "" {
			t.Errorf("%s: %+v; want not saved, with a reason", name, st)
		}
	}
	os.Remove(report)
	target := filepath.Join(dir, "elsewhere")
	os.WriteFile(target, []byte(`{"kept": [], "dropped": {}, "bytes": 1, "saved": true}`), 0o600)
	if err := os.Symlink(target, report); err != nil {
		t.Fatal(err)
	}
	if st := ReadState(openDir(t, dir)).State; st.Saved {
		t.Errorf("a report through a symlink was read: %+v", st)
	}
}

// openDir is dir held open, as a run's display directory is.
func openDir(t *testing.T, dir string) *safefs.Dir {
	t.Helper()
	d, err := safefs.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// TestStateRequestNotThroughLink: what a warm sandbox left at the state
// request's name before its take (a link to a host file, to a host path
// that does not exist, a file of its own words) is replaced by agentrun's
// request; the host's files are not written through the link.
func TestStateRequestNotThroughLink(t *testing.T) {
	q := &StateRequest{keep: true, maxBytes: 10}
	want := "keep=1 reset=0 max=10 file=" + StateFile + "\n"
	host := t.TempDir()
	victim, absent := filepath.Join(host, "victim"), filepath.Join(host, "absent")
	if err := os.WriteFile(victim, []byte("root's"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, plant := range map[string]func(string) error{
		"link to a host file":   func(p string) error { return os.Symlink(victim, p) },
		"link to no file":       func(p string) error { return os.Symlink(absent, p) },
		"the program's request": func(p string) error { return os.WriteFile(p, []byte("keep=0 reset=1"), 0o666) },
	} {
		dir := t.TempDir()
		if err := plant(filepath.Join(dir, stateRequestFile)); err != nil {
			t.Fatal(err)
		}
		if err := q.Write(openDir(t, dir)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		fi, err := os.Lstat(filepath.Join(dir, stateRequestFile))
		got, _ := os.ReadFile(filepath.Join(dir, stateRequestFile))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o444 || string(got) != want {
			t.Errorf("%s: the request is %v (%v), %q; want a file 0444, %q", name, fi, err, got, want)
		}
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != "root's" {
		t.Errorf("the host's file now holds %q (%v)", b, err)
	}
	if _, err := os.Lstat(absent); err == nil {
		t.Errorf("a file was made at %s", absent)
	}
}
