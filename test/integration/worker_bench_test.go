package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/compose"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/internal/worker"
)

// BenchmarkWorker measures, as root with a real nats-server:
//
//	local              print(45) on the python image through the runner, no bus
//	submit-to-result   the same task published, run by one worker (1 slot)
//	                   and its result read back: the bus's cost is the
//	                   difference
//	throughput/N       b.N busybox echo tasks published at once and run by N
//	                   workers of 2 slots each; tasks/s is the figure
//
//	AGENTRUN_BIN=$PWD/bin/agentrun go test -tags seccomp,runc_nocriu -run '^$' -bench BenchmarkWorker -benchtime 30x ./test/integration/
func BenchmarkWorker(b *testing.B) {
	py := fmt.Sprintf(`{"image":%q,"code":"print(45)"}`, pythonImage)

	b.Run("local", func(b *testing.B) {
		cfg := testConfig(b)
		r, err := compose.Runner(cfg, nil)
		if err != nil {
			b.Fatal(err)
		}
		plan, err := task.Load([]byte(py), cfg)
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if res := r.Run(context.Background(), plan, runapi.Hooks{}); res.Stdout != "45\n" {
				b.Fatalf("%+v", res)
			}
		}
	})

	b.Run("submit-to-result", func(b *testing.B) {
		ns := startNATS(b)
		w := startWorker(b, map[string]any{"nats": []string{ns.url()}, "slots": 1})
		defer w.stop()
		bus := dialBus(b, ns.url())
		kv := bus.kv()
		i := 0
		for b.Loop() {
			i++
			id := fmt.Sprintf("lat-%d-%d", time.Now().UnixNano(), i)
			if _, err := worker.Publish(context.Background(), bus.js, bus.wc, id, []byte(py)); err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			res, err := worker.Wait(ctx, kv, id)
			cancel()
			if err != nil || res.Stdout != "45\n" {
				b.Fatalf("%v %+v", err, res)
			}
		}
	})

	for _, n := range []int{1, 2} {
		b.Run(fmt.Sprintf("throughput/%d", n), func(b *testing.B) {
			ns := startNATS(b)
			for range n {
				w := startWorker(b, map[string]any{"nats": []string{ns.url()}, "slots": 2})
				defer w.stop()
			}
			bus := dialBus(b, ns.url())
			var ids []string
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				id := fmt.Sprintf("tp-%d-%d", n, i)
				ids = append(ids, id)
				bus.publish(id, echoTask(id))
			}
			bus.results(ids, 10*time.Minute)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tasks/s")
		})

	}
}
