package spec

import "testing"

// BenchmarkSpec is the spec work of one run: the locked-down default with
// every option a run applies, then Validate.
func BenchmarkSpec(b *testing.B) {
	opts := []SpecOpt{WithArgs("python3", "-u", "/workspace/main.py"), WithEnv(map[string]string{"A": "1"}),
		WithCgroupsPath("/agentrun/ar-0123456789abcdef"), WithMemory(256 << 20), WithCPUs(0.5), WithPids(64),
		WithTmpSize(64<<20, 64<<20), WithWorkspace("/run/agentrun/runs/ar-0123456789abcdef/workspace"), WithSeccomp()}
	for b.Loop() {
		s, err := New("/var/lib/agentrun/rootfs/sha256/x", opts...)
		if err != nil {
			b.Fatal(err)
		}
		if err := Validate(s); err != nil {
			b.Fatal(err)
		}
	}
}
