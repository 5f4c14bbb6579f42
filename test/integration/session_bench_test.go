package integration

import (
	"context"
	"testing"

	"github.com/agentrun/agentrun/internal/compose"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/task"
)

// Session costs against a plain cold run (docs/bench.md):
//
//	AGENTRUN_BIN=$PWD/bin/agentrun go test -tags seccomp,runc_nocriu -run X -bench 'Session|ColdRun' -benchtime 30x ./test/integration/

func benchRun(b *testing.B, keep bool) {
	cfg := sessionCfg(b, "libcontainer", "256m")
	r, err := compose.Runner(cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	extra := map[string]any{}
	if keep {
		id, err := r.Sessions().Create()
		if err != nil {
			b.Fatal(err)
		}
		defer r.Sessions().Remove(id)
		extra = map[string]any{"session": id, "keep_workspace": true}
	}
	plan, err := task.Load([]byte(pyTask("print(45)", extra)), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if res := r.Run(context.Background(), plan, runapi.Hooks{}); res.Error != "" || res.Stdout != "45\n" {
			b.Fatalf("run: %+v", res)
		}
	}
}

// BenchmarkColdRun: print(45) in a fresh tmpfs workspace, no pool.
func BenchmarkColdRun(b *testing.B) { benchRun(b, false) }

// BenchmarkSessionRun: print(45) in a kept session's workspace (lock,
// loop device, ext4 mount and unmount on top of the cold run).
func BenchmarkSessionRun(b *testing.B) { benchRun(b, true) }

// BenchmarkSessionCreate: sessions new (sparse image, mkfs.ext4, one mount
// to empty its root) and rm.
func BenchmarkSessionCreate(b *testing.B) {
	cfg := sessionCfg(b, "libcontainer", "256m")
	r, err := compose.Runner(cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	for range b.N {
		id, err := r.Sessions().Create()
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := r.Sessions().Remove(id); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// BenchmarkSessionFiles: one host-side listing (lock, mount, walk, unmount).
func BenchmarkSessionFiles(b *testing.B) {
	cfg := sessionCfg(b, "libcontainer", "256m")
	r, err := compose.Runner(cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	id, err := r.Sessions().Create()
	if err != nil {
		b.Fatal(err)
	}
	defer r.Sessions().Remove(id)
	for range b.N {
		if _, err := r.Sessions().Files(id); err != nil {
			b.Fatal(err)
		}
	}
}
