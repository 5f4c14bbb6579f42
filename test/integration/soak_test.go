package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/audit"
	"github.com/agentrun/agentrun/internal/compose"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/proxy/proxytest"
)

// Soak parameters. AGENTRUN_SOAK_RUNS sets the number of runs (make soak:
// 1000); the default keeps the test near a minute on two cores.
const (
	soakDefaultRuns  = 120
	soakConcurrency  = 8
	soakRSSGrowthMax = 30 << 20 // bytes of VmRSS growth allowed from 10% to the end
	soakGoroutineTol = 3        // goroutines allowed above the baseline once settled
	soakRunDeadline  = 2 * time.Minute
)

// soakKind is one kind of run in the soak mix: its task and the outcome it
// must have.
type soakKind struct {
	name  string
	task  func(i int) string
	check func(i int, r *result.Result) string // "" when r is the expected outcome
}

func soakKinds(in *proxytest.Internet) []soakKind {
	flood := 4 << 20
	plain := func(r *result.Result) string {
		if r.TimedOut || r.OOMKilled || r.Signal != "" {
			return fmt.Sprintf("timed_out %v oom_killed %v signal %q", r.TimedOut, r.OOMKilled, r.Signal)
		}
		return ""
	}
	return []soakKind{
		{
			name: "print",
			task: func(i int) string {
				return pyTask(fmt.Sprintf("print('soak %d')", i), map[string]any{"session": fmt.Sprintf("soak-%d", i)})
			},
			check: func(i int, r *result.Result) string {
				if want := fmt.Sprintf("soak %d\n", i); r.ExitCode != 0 || r.Stdout != want || r.Session != fmt.Sprintf("soak-%d", i) {
					return fmt.Sprintf("exit %d stdout %q session %q; want exit 0 stdout %q", r.ExitCode, r.Stdout, r.Session, want)
				}
				return plain(r)
			},
		},
		{
			name: "exit",
			task: func(i int) string { return pyTask("import sys; sys.exit(7)", nil) },
			check: func(i int, r *result.Result) string {
				if r.ExitCode != 7 || r.ExitStatus() != 7 {
					return fmt.Sprintf("exit %d status %d; want 7", r.ExitCode, r.ExitStatus())
				}
				return plain(r)
			},
		},
		{
			name: "timeout",
			task: func(i int) string {
				return pyTask("while True: pass", map[string]any{"limits": map[string]any{"timeout": "300ms"}})
			},
			check: func(i int, r *result.Result) string {
				if !r.TimedOut || r.OOMKilled || r.ExitStatus() != result.ExitTimeout {
					return fmt.Sprintf("timed_out %v oom_killed %v status %d; want a timeout", r.TimedOut, r.OOMKilled, r.ExitStatus())
				}
				return ""
			},
		},
		{
			name: "oom",
			task: func(i int) string {
				return pyTask("x = bytearray(200 << 20)\nprint('survived')", map[string]any{"limits": map[string]any{"memory": "32m"}})
			},
			check: func(i int, r *result.Result) string {
				if !r.OOMKilled || r.TimedOut || r.ExitStatus() != result.ExitKilled || strings.Contains(r.Stdout, "survived") {
					return fmt.Sprintf("oom_killed %v timed_out %v status %d stdout %q; want an OOM kill", r.OOMKilled, r.TimedOut, r.ExitStatus(), r.Stdout)
				}
				return ""
			},
		},
		{
			name: "flood",
			task: func(i int) string {
				return pyTask(fmt.Sprintf("import sys\nsys.stdout.write('x' * %d)\nsys.stdout.flush()", flood),
					map[string]any{"limits": map[string]any{"output_bytes": 1024}})
			},
			check: func(i int, r *result.Result) string {
				if r.ExitCode != 0 || !r.StdoutTruncated || len(r.Stdout) != 1024 || r.StdoutBytes != int64(flood) {
					return fmt.Sprintf("exit %d truncated %v kept %d counted %d; want exit 0, truncated, 1024 kept, %d counted",
						r.ExitCode, r.StdoutTruncated, len(r.Stdout), r.StdoutBytes, flood)
				}
				return plain(r)
			},
		},
		{
			name: "allow",
			task: func(i int) string {
				return netTask(in, fetchPy+`print(fetch("https://internet.test/hello"))`, "internet.test")
			},
			check: func(i int, r *result.Result) string {
				if want := "200 hello from internet.test over https\n"; r.ExitCode != 0 || r.Stdout != want {
					return fmt.Sprintf("exit %d stdout %q stderr %q; want %q", r.ExitCode, r.Stdout, r.Stderr, want)
				}
				for _, a := range r.Network.Allowed {
					if a.Host == "internet.test" && a.Port == 443 && a.BytesIn > 0 && a.BytesOut > 0 {
						return plain(r)
					}
				}
				return fmt.Sprintf("network.allowed lacks internet.test:443 with byte counts: %+v", r.Network.Allowed)
			},
		},
	}
}

// soakRunsc is the few gVisor runs mixed in.
var soakRunsc = soakKind{
	name: "runsc",
	task: func(i int) string {
		return pyTask(fmt.Sprintf("print('runsc %d')", i), map[string]any{"runtime": "runsc"})
	},
	check: func(i int, r *result.Result) string {
		if want := fmt.Sprintf("runsc %d\n", i); r.ExitCode != 0 || r.Stdout != want || r.Runtime != "runsc" {
			return fmt.Sprintf("exit %d stdout %q runtime %q; want exit 0 stdout %q on runsc", r.ExitCode, r.Stdout, r.Runtime, want)
		}
		return ""
	},
}

// TestSoak runs many runs of every outcome at once on one runner and checks
// that each result came back as expected and that nothing accumulated:
// host state, this process's fds, goroutines and memory, host links and
// processes.
func TestSoak(t *testing.T) {
	n := soakDefaultRuns
	if s := os.Getenv("AGENTRUN_SOAK_RUNS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 10 {
			t.Fatalf("AGENTRUN_SOAK_RUNS=%q: want an integer of at least 10", s)
		}
		n = v
	}
	in := proxytest.NewInternet(t)
	cfg := netConfig(t, in)
	auditPath := filepath.Join(t.TempDir(), "audit.jsonl")
	log, err := audit.Open(auditPath)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	r, err := compose.Runner(cfg, log)
	if err != nil {
		t.Fatal(err)
	}

	// The mix: libcontainer kinds round robin, plus one runsc run in 20
	// (at least 3).
	kinds := soakKinds(in)
	type job struct {
		i    int
		kind soakKind
	}
	var jobs []job
	for i := range n {
		jobs = append(jobs, job{i, kinds[i%len(kinds)]})
	}
	nRunsc := max(3, n/20)
	for k := range nRunsc {
		// Spread through the run.
		jobs = slices.Insert(jobs, (k+1)*n/(nRunsc+1)+k, job{n + k, soakRunsc})
	}
	total := len(jobs)

	// Warm up: one run of each kind, one after another, so that what the
	// runner and its libraries open once and keep (the cgroup root fd, the
	// runtime's cgroup files) is in the baseline.
	var warmIDs []string
	for k, kind := range append(slices.Clone(kinds), soakRunsc) {
		i := -1 - k
		plan, err := task.Load([]byte(kind.task(i)), cfg)
		if err != nil {
			t.Fatalf("warm-up %s: %v", kind.name, err)
		}
		res := r.Run(context.Background(), plan, runapi.Hooks{})
		if res.Error != "" {
			t.Fatalf("warm-up %s: %s", kind.name, res.Error)
		}
		if msg := kind.check(i, res); msg != "" {
			t.Fatalf("warm-up %s: %s", kind.name, msg)
		}
		warmIDs = append(warmIDs, res.ID)
	}
	warmups := len(kinds) + 1

	linksBefore := hostLinks(t)
	fdsBefore, fdsBeforeList := openFDs(t), fdTargets()
	goroutinesBefore := goroutines()
	if procs := procsMentioning(stateDir); len(procs) > 0 {
		t.Fatalf("before the soak, processes already mention %s:\n  %s", stateDir, strings.Join(procs, "\n  "))
	}

	// A warm pool serves what it can of the mix (the kinds of the default
	// shape); it is closed before the host is checked.
	pool := r.NewPool(map[string]int{cfg.Image: 2})
	r.UsePool(pool)
	poolClosed := false
	defer func() {
		if !poolClosed {
			pool.Close()
		}
	}()
	seed, err := task.Load([]byte(kinds[0].task(0)), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := pool.Seed(context.Background(), seed); err != nil {
		t.Fatal(err)
	}
	// Full before the first run: at the soak's concurrency the runs
	// outnumber the CPUs, and the pool makes nothing then (fillLimit), so
	// without this wait whether any run is served from it is a race.
	waitReady(t, pool, cfg.Image, 2)

	var (
		done       atomic.Int64
		rssEarly   atomic.Int64
		mu         sync.Mutex
		failures   []string
		counts     = map[string]int{}
		durations  = map[string]time.Duration{}
		ids        = map[string]bool{}
		jobc       = make(chan job)
		wg         sync.WaitGroup
		earlyAfter = int64(max(1, total/10))
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		failures = append(failures, fmt.Sprintf(format, args...))
	}
	runJob := func(j job) {
		plan, err := task.Load([]byte(j.kind.task(j.i)), cfg)
		if err != nil {
			fail("run %d (%s): task.Load: %v", j.i, j.kind.name, err)
			done.Add(1)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), soakRunDeadline)
		t0 := time.Now()
		res := r.Run(ctx, plan, runapi.Hooks{})
		took := time.Since(t0)
		cancel()
		switch {
		case res == nil:
			fail("run %d (%s): lost: Run returned nil", j.i, j.kind.name)
		case res.Error != "":
			fail("run %d (%s): error %q (stderr %q)", j.i, j.kind.name, res.Error, res.Stderr)
		default:
			if msg := j.kind.check(j.i, res); msg != "" {
				fail("run %d (%s) %s: %s", j.i, j.kind.name, res.ID, msg)
			}
		}
		mu.Lock()
		counts[j.kind.name]++
		durations[j.kind.name] += took
		if res != nil {
			if ids[res.ID] {
				failures = append(failures, fmt.Sprintf("run %d: id %s given twice", j.i, res.ID))
			}
			ids[res.ID] = true
		}
		mu.Unlock()
		if done.Add(1) == earlyAfter {
			rss, err := rssBytes()
			if err != nil {
				fail("sampling VmRSS: %v", err)
			}
			rssEarly.Store(rss)
		}
	}
	// The first run alone, so that it finds the pool full and undisturbed
	// (another shape's run first would make the pool switch to that
	// shape): a run of the soak served from the pool, for certain.
	start := time.Now()
	runJob(jobs[0])
	if st := pool.Stats(); st.Hits != 1 {
		t.Errorf("the soak's first run, of the seeded shape, was not served from the full pool: %+v", st)
	}
	for range soakConcurrency {
		wg.Go(func() {
			for j := range jobc {
				runJob(j)
			}
		})
	}
	for _, j := range jobs[1:] {
		jobc <- j
	}
	close(jobc)
	wg.Wait()
	elapsed := time.Since(start)
	poolStats := pool.Stats()
	poolClosed = true
	if err := pool.Close(); err != nil {
		t.Errorf("closing the pool: %v", err)
	}
	t.Logf("pool: %d runs served from it, %d of its image ran cold", poolStats.Hits, poolStats.Misses)
	rssEnd, err := rssBytes()
	if err != nil {
		t.Fatal(err)
	}

	names := slices.Sorted(func(yield func(string) bool) {
		for k := range counts {
			if !yield(k) {
				return
			}
		}
	})
	var per []string
	for _, k := range names {
		per = append(per, fmt.Sprintf("%s %d (avg %v)", k, counts[k], (durations[k]/time.Duration(counts[k])).Round(time.Millisecond)))
	}
	t.Logf("%d runs at concurrency %d in %v: %.1f runs/s; %s", total, soakConcurrency, elapsed.Round(time.Millisecond),
		float64(total)/elapsed.Seconds(), strings.Join(per, ", "))
	t.Logf("VmRSS after %d runs: %.1f MiB; at the end: %.1f MiB", earlyAfter,
		float64(rssEarly.Load())/(1<<20), float64(rssEnd)/(1<<20))

	const maxShown = 20
	for i, f := range failures {
		if i == maxShown {
			t.Errorf("... and %d more failures", len(failures)-maxShown)
			break
		}
		t.Error(f)
	}
	if got := len(ids); got != total {
		t.Errorf("%d distinct results for %d runs", got, total)
	}
	// Every run left exactly one audit record, with its id.
	for _, id := range warmIDs {
		ids[id] = true
	}
	if recs := auditIDs(t, auditPath); len(recs) != total+warmups {
		t.Errorf("audit log has %d records for %d runs and %d warm-up runs", len(recs), total, warmups)
	} else {
		for id := range ids {
			if !recs[id] {
				t.Errorf("audit log lacks run %s", id)
				break
			}
		}
	}

	// The host, and this process, are as they were.
	assertNoLeaks(t)
	if after := hostLinks(t); after != linksBefore {
		t.Errorf("host network links before %d, after %d", linksBefore, after)
	}
	if procs := procsMentioning(stateDir); len(procs) > 0 {
		t.Errorf("processes left that mention %s:\n  %s", stateDir, strings.Join(procs, "\n  "))
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && (runtime.NumGoroutine() > goroutinesBefore+soakGoroutineTol || openFDs(t) > fdsBefore) {
		time.Sleep(50 * time.Millisecond)
	}
	if g := runtime.NumGoroutine(); g > goroutinesBefore+soakGoroutineTol {
		t.Errorf("goroutines before %d, after %d (tolerance %d)\n%s", goroutinesBefore, g, soakGoroutineTol, goroutineDump())
	}
	if fds := openFDs(t); fds > fdsBefore {
		t.Errorf("open fds before %d, after %d\nbefore:\n  %s\nafter:\n  %s", fdsBefore, fds,
			strings.Join(fdsBeforeList, "\n  "), strings.Join(fdTargets(), "\n  "))
	}
	if grew := rssEnd - rssEarly.Load(); grew > soakRSSGrowthMax {
		t.Errorf("VmRSS grew by %.1f MiB from run %d to the end (%.1f -> %.1f MiB); allowed %d MiB",
			float64(grew)/(1<<20), earlyAfter, float64(rssEarly.Load())/(1<<20), float64(rssEnd)/(1<<20), soakRSSGrowthMax>>20)
	}
}

// rssBytes is this process's resident set after returning freed memory to
// the OS, so that what remains is what is live.
func rssBytes() (int64, error) {
	debug.FreeOSMemory()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) != 2 || f[1] != "kB" {
				return 0, fmt.Errorf("VmRSS line %q", line)
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("VmRSS line %q: %v", line, err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("no VmRSS in /proc/self/status")
}

// openFDs counts this process's open file descriptors.
func openFDs(t testing.TB) int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(entries) - 1 // the directory's own fd
}

// fdTargets lists what this process's fds point at, for a failure message.
func fdTargets() []string {
	entries, _ := os.ReadDir("/proc/self/fd")
	var out []string
	for _, e := range entries {
		target, _ := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		out = append(out, e.Name()+" -> "+target)
	}
	return out
}

func goroutineDump() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

// procsMentioning lists processes other than this one whose command line
// contains s.
func procsMentioning(s string) []string {
	entries, _ := os.ReadDir("/proc")
	self := strconv.Itoa(os.Getpid())
	var out []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil || e.Name() == self {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue // gone meanwhile
		}
		cmd := strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " ")
		if strings.Contains(cmd, s) {
			out = append(out, e.Name()+": "+cmd)
		}
	}
	return out
}

// auditIDs reads the run ids in an audit log.
func auditIDs(t testing.TB, path string) map[string]bool {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ids := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var rec audit.Record
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Errorf("audit line: %v: %s", err, sc.Text())
			continue
		}
		ids[rec.ID] = true
	}
	return ids
}
