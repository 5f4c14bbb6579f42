package result

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestExitStatus(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    Result
		want int
	}{
		{"ok", Result{}, 0},
		{"program exit", Result{ExitCode: 3}, 3},
		{"signal", Result{ExitCode: 139, Signal: "SIGSEGV"}, 139},
		{"timeout", Result{ExitCode: 137, TimedOut: true}, ExitTimeout},
		{"oom", Result{ExitCode: 137, OOMKilled: true}, ExitKilled},
		{"setup error", Result{Error: "bad task", TimedOut: true}, ExitSetup},
	} {
		if got := tc.r.ExitStatus(); got != tc.want {
			t.Errorf("%s: ExitStatus() = %d; want %d", tc.name, got, tc.want)
		}
		// exit_code says what the exit status says, and settling twice
		// changes nothing.
		r := tc.r
		r.Settle()
		r.Settle()
		if r.ExitCode != tc.want {
			t.Errorf("%s: settled exit_code %d; want the exit status %d", tc.name, r.ExitCode, tc.want)
		}
	}
}

func TestSetOutputKeepsInvalidBytes(t *testing.T) {
	var r Result
	bad := []byte("ok \xff\xfe end")
	r.SetOutput([]byte("日本語"), bad)
	if r.Stdout != "日本語" || r.StdoutBase64 != "" {
		t.Errorf("valid UTF-8: stdout %q, base64 %q; want the text and no base64", r.Stdout, r.StdoutBase64)
	}
	if r.StderrBase64 == "" || string(r.RawStderr()) != string(bad) {
		t.Errorf("invalid UTF-8: base64 %q gives %q; want the exact bytes", r.StderrBase64, r.RawStderr())
	}
	if string(r.RawStdout()) != "日本語" {
		t.Errorf("RawStdout %q", r.RawStdout())
	}
}

// TestNotRun: the result of a task that never ran has exit_code 125, the
// status agentrun run exits with, never 0, and its error.
func TestNotRun(t *testing.T) {
	res := NotRun(errors.New("limits.memory: 64g exceeds policy"))
	if res.ExitCode != ExitSetup || res.ExitStatus() != ExitSetup {
		t.Errorf("exit_code %d, status %d; want %d", res.ExitCode, res.ExitStatus(), ExitSetup)
	}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"exit_code":125`, `"error":"limits.memory: 64g exceeds policy"`, `"allowed":[]`, `"files":{}`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("%s lacks %s", b, want)
		}
	}
}
