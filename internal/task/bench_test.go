package task

import (
	"testing"

	"github.com/agentrun/agentrun/internal/config"
)

// BenchmarkLoad parses and validates a typical task against the default
// config.
func BenchmarkLoad(b *testing.B) {
	cfg := config.Default()
	data := []byte(`{"session": "s1", "code": "import json\nprint(json.dumps({'a': 1}))", "files": {"data.csv": {"content": "a,b\n1,2\n"}},
		"collect": ["out/*.png"], "env": {"MPLBACKEND": "Agg"}, "limits": {"timeout": "5s", "memory": "128m"}}`)
	for b.Loop() {
		if _, err := Load(data, cfg); err != nil {
			b.Fatal(err)
		}
	}
}
