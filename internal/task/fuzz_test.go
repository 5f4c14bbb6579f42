package task

import (
	"errors"
	"testing"

	"github.com/agentrun/agentrun/internal/config"
)

// FuzzParse checks that Parse never panics and that an accepted task either
// resolves into a sane Plan or fails with an *Error.
func FuzzParse(f *testing.F) {
	for _, tc := range errorCases {
		f.Add([]byte(tc.json))
	}
	f.Add([]byte(`{"code":"print(1)"}`))
	f.Add([]byte(`{"command":["ls","-l"],"files":{"a/b":{"content_base64":"AAEC"}},"collect":["*"],"env":{"A":"b"},` +
		`"network":{"allow":["*.example.com:443"]},"limits":{"memory":"1g","cpus":1,"pids":10}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tk, err := Parse(data)
		if err != nil {
			var te *Error
			if !errors.As(err, &te) {
				t.Fatalf("Parse error is not *Error: %v", err)
			}
			return
		}
		cfg := config.Default()
		p, err := tk.Resolve(cfg)
		if err != nil {
			var te *Error
			if !errors.As(err, &te) {
				t.Fatalf("Resolve error is not *Error: %v", err)
			}
			return
		}
		if len(p.Argv) == 0 || p.Image == "" || p.Files == nil || p.Env == nil {
			t.Fatalf("incomplete plan: %+v", p)
		}
		for name := range p.Files {
			if reason := checkRelPath(name); reason != "" || name == p.CodeFile {
				t.Fatalf("bad file name %q accepted", name)
			}
		}
		for name := range p.Env {
			if config.IsReservedEnv(name) {
				t.Fatalf("reserved env %q accepted", name)
			}
		}
		max := Limits{Timeout: 60e9, Memory: 2 << 30, CPUs: 2, Pids: 512, OutputBytes: 1 << 20,
			TmpSize: 1 << 30, WorkspaceSize: 1 << 30, NetBytes: 1 << 30, NetConns: 256}
		l := p.Limits
		if l.Timeout <= 0 || l.Timeout > max.Timeout || l.Memory <= 0 || l.Memory > max.Memory || l.CPUs <= 0 || l.CPUs > max.CPUs ||
			l.Pids <= 0 || l.Pids > max.Pids || l.OutputBytes <= 0 || l.OutputBytes > max.OutputBytes || l.TmpSize <= 0 || l.TmpSize > max.TmpSize ||
			l.WorkspaceSize <= 0 || l.WorkspaceSize > max.WorkspaceSize || l.NetBytes <= 0 || l.NetBytes > max.NetBytes || l.NetConns <= 0 || l.NetConns > max.NetConns {
			t.Fatalf("limits out of policy: %+v", l)
		}
	})
}
