package integration

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/compose"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/runner"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/proxy/proxytest"
)

// BenchmarkAllowlistRun: one allowlist task (print(45), network.allow of
// one name), run back to back cold and from a warm pool, interleaved;
// the medians of each, in ms from the call to the final result (what
// serve's client waits for), and of the part of it spent getting the
// sandbox ready (image, then the pool's sandbox with its policy bound, or
// a cold set-up). The pooled run shares the CPUs with its sandbox's
// refill, which starts as it takes one.
//
//	AGENTRUN_BIN=$PWD/bin/agentrun go test -tags seccomp,runc_nocriu -run X -bench AllowlistRun -benchtime 30x ./test/integration/
func BenchmarkAllowlistRun(b *testing.B) {
	in := proxytest.NewInternet(b)
	cfg := netConfig(b, in)
	coldR, err := compose.Runner(cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	pooledR, err := compose.Runner(cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	pool := pooledR.NewPool(map[string]int{pythonImage: 1})
	pooledR.UsePool(pool)
	defer pool.Close()
	plan, err := task.Load([]byte(pyTask("print(45)", map[string]any{"network": map[string]any{"allow": []string{"internet.test"}}})), cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := pool.Seed(context.Background(), plan); err != nil {
		b.Fatal(err)
	}
	ready := func() { waitReady(b, pool, pythonImage, 1) }
	// A run's latency is until its result is final, as serve answers
	// (its tear-down goes on after).
	var setups []time.Duration
	run := func(r *runner.Runner) time.Duration {
		start := time.Now()
		var took time.Duration
		res := r.Run(context.Background(), plan, runapi.Hooks{
			Result: func(*result.Result) { took = time.Since(start) },
			Setup:  func(_ bool, d time.Duration) { setups = append(setups, d) },
		})

		if res.Error != "" || res.Stdout != "45\n" {
			b.Fatalf("run: %+v", res)
		}
		return took
	}
	var cold, pooled, coldSetup, pooledSetup []time.Duration
	b.ResetTimer()
	for range b.N {
		cold = append(cold, run(coldR))
		coldSetup = append(coldSetup, setups[len(setups)-1])
		b.StopTimer()
		ready()
		hits := pool.Stats().Hits
		b.StartTimer()
		pooled = append(pooled, run(pooledR))
		pooledSetup = append(pooledSetup, setups[len(setups)-1])
		if pool.Stats().Hits != hits+1 {
			b.Fatalf("the pooled run was not served from the pool: %+v", pool.Stats())
		}
	}
	b.StopTimer()
	median := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	c, p := median(cold), median(pooled)
	b.ReportMetric(c, "cold-ms")
	b.ReportMetric(p, "pooled-ms")
	b.ReportMetric(p/c, "pooled/cold")
	b.ReportMetric(median(coldSetup), "cold-setup-ms")
	b.ReportMetric(median(pooledSetup), "pooled-setup-ms")
}
