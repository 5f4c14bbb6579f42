package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The load section: print(45) run back to back by k clients at once, for
// each k of concurrencies, against the floor and each way agentrun serves
// runs. Every subject is measured at every k in each of loadRounds rounds,
// interleaved (round, then k, then subject), so that a change in the
// shared machine's load falls on all of them alike.
var (
	loadRuns   = flag.Int("load-runs", 40, "runs per subject, concurrency and round in the load section")
	loadRounds = flag.Int("load-rounds", 3, "rounds of the load section (medians are taken over them)")
	loadFilter = flag.String("load-filter", "", "measure only the load subjects whose names contain this, or one of its |-separated parts (and the floor)")
	loadK      = flag.String("load-k", "1,4,8", "the concurrencies of the load section, comma-separated")
	baseline   = flag.String("baseline", "", "another agentrun binary (an earlier build, say) whose serve, without and with a pool, the load section measures too, interleaved")
	loadOnly   = flag.Bool("load-only", false, "measure the load section only and print it (docs/bench.md is not written)")
	loadStart  string // the load average as the load section starts
)

// pooledRunscName names the load subject of runsc runs from a pool.
const pooledRunscName = "agentrun serve, runsc, pool of 4"

// loadSubject is one way of running print(45) under load.
type loadSubject struct {
	name, note string
	runs       int // per concurrency and round; loadRuns when 0
	run        func() error
	// before, if not nil, runs untimed before each measurement (a pool
	// filled, the previous runs' tear-down ended).
	before func() error
	// cpu is the CPU time (user+sys) so far of everything the subject
	// started, as far as it has been reaped.
	cpu func() time.Duration
	// settle, if not nil, waits until the work that the runs caused has
	// ended (tear-downs, refills) before cpu is read.
	settle func() error
	err    string

	tput   map[int][]float64       // runs/s per round
	lat    map[int][]time.Duration // every run's latency
	cpuRun map[int][]time.Duration // CPU per run, per round
	host   map[int][]time.Duration // the host's busy CPU per run, per round
}

// loadBench runs the load section.
func loadBench(work, rootfs, cfg, task string) []*loadSubject {
	loadStart = loadAvg()
	concurrencies = nil
	for _, f := range strings.Split(*loadK, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || k < 1 {
			log.Fatalf("-load-k: %q is not a concurrency", f)
		}
		concurrencies = append(concurrencies, k)
	}
	bare := &loadSubject{name: "bare chroot python3", note: "the floor",
		run: func() error {
			return checkCmd(exec.Command("chroot", rootfs, "python3", "-c", "print(45)"))
		},
		cpu: childrenCPU}
	cold := &loadSubject{name: "agentrun run (cold CLI)", note: "one agentrun process per run",
		run: func() error {
			return checkCmd(exec.Command(*bin, "run", "--config", cfg, task))
		},
		cpu: childrenCPU}
	subjects := []*loadSubject{bare, cold}

	var started []*served
	defer func() {
		for _, s := range started {
			s.stop()
		}
	}()
	// A server is started only for subjects the filter keeps: one that
	// fills a pool idle would take CPU from the others.
	want := func(names ...string) bool {
		return slices.ContainsFunc(names, filtered)
	}
	errFiltered := errors.New("left out by -load-filter")
	serves := func(exe, name, suffix string) *served {
		noPoolName, poolName := "agentrun serve, no pool"+suffix, "agentrun serve, pool of 4"+suffix
		noPool, err := (*served)(nil), errFiltered
		if want(noPoolName, "agentrun serve, runsc") {
			if noPool, err = startServeAs(exe, work, rootfs, name+"-nopool", 0); noPool != nil {
				started = append(started, noPool)
			}
		}
		subjects = append(subjects, noPool.subject(noPoolName, "max_concurrent 8; every run set up cold in the server", err, 0, `{"code":"print(45)"}`))
		pooled, err := (*served)(nil), errFiltered
		if want(poolName) {
			if pooled, err = startServeAs(exe, work, rootfs, name+"-pool", 4); pooled != nil {
				started = append(started, pooled)
			}
		}
		subjects = append(subjects, pooled.subject(poolName, "max_concurrent 8; each measurement starts with 4 ready; runs that find none run cold", err, 4, `{"code":"print(45)"}`))
		return noPool
	}
	noPool := serves(*bin, "load", "")
	if *baseline != "" {
		serves(*baseline, "load-baseline", " (baseline: "+filepath.Base(*baseline)+")")
	}
	runsc := noPool.subject("agentrun serve, runsc", "the no-pool server, runtime runsc: every run set up cold", nil, 0, `{"code":"print(45)","runtime":"runsc"}`)
	runsc.runs = max(8, *loadRuns/4)
	if noPool == nil {
		runsc.err = "no server"
	}
	runscPool, err := (*served)(nil), errFiltered
	if want(pooledRunscName) {
		if runscPool, err = startServeOn(*bin, work, rootfs, "load-runsc-pool", 4, "runsc"); runscPool != nil {
			started = append(started, runscPool)
		}
	}
	pooledRunsc := runscPool.subject(pooledRunscName, "max_concurrent 8, runtime runsc; each measurement starts with 4 created sandboxes; runs that find none run cold", err, 4, `{"code":"print(45)","runtime":"runsc"}`)
	pooledRunsc.runs = runsc.runs
	subjects = append(subjects, runsc, pooledRunsc)

	subjects = slices.DeleteFunc(subjects, func(s *loadSubject) bool {
		return s != bare && !filtered(s.name)
	})
	for _, s := range subjects {
		s.tput, s.lat, s.cpuRun, s.host = map[int][]float64{}, map[int][]time.Duration{}, map[int][]time.Duration{}, map[int][]time.Duration{}
		if s.err == "" {
			if err := s.run(); err != nil { // warm-up and availability
				s.err = err.Error()
				log.Printf("load: %s: not measured: %v", s.name, err)
			}
		}
	}
	for round := range *loadRounds {
		for _, k := range concurrencies {
			for _, s := range inTurn(subjects, round) {
				if s.err == "" {
					if err := s.measure(k); err != nil {
						s.err = err.Error()
						log.Printf("load: %s, concurrency %d, round %d: %v", s.name, k, round+1, err)
					}
				}
			}
		}
	}
	return subjects
}

// subject is s as a load subject: tasks of taskJSON posted to it. pool is
// the number of sandboxes to wait for before each measurement.
func (s *served) subject(name, note string, err error, pool int, taskJSON string) *loadSubject {
	ls := &loadSubject{name: name, note: note}
	if err != nil || s == nil {
		ls.err = fmt.Sprint(err)
		return ls
	}
	ls.run = func() error {
		res, err := s.client.Run(context.Background(), []byte(taskJSON))
		if err != nil {
			return err
		}
		if res.Error != "" || res.Stdout != "45\n" {
			return fmt.Errorf("unexpected result: %q %s", res.Stdout, res.Error)
		}
		return nil
	}
	ls.settle = func() error { return s.idle(pool) }
	ls.before = ls.settle
	ls.cpu = func() time.Duration { return procCPU(s.cmd.Process.Pid) }
	return ls
}

// idle waits until the server runs nothing and its pool holds pool
// sandboxes.
func (s *served) idle(pool int) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		h, err := s.client.Health(context.Background())
		if err != nil {
			return err
		}
		ready := 0
		if h.Pool != nil {
			for _, n := range h.Pool.Ready {
				ready += n
			}
		}
		if h.Running == 0 && h.Queued == 0 && ready >= pool {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("server not idle within 60s (running %d, ready %d)", h.Running, ready)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// measure runs s's runs with k clients at once and records them.
func (s *loadSubject) measure(k int) error {
	runs := *loadRuns
	if s.runs > 0 {
		runs = s.runs
	}
	if s.before != nil {
		if err := s.before(); err != nil {
			return err
		}
	}
	cpu0, host0 := s.cpu(), hostBusy()
	jobs := make(chan int)
	lat := make([]time.Duration, runs)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	start := time.Now()
	for range k {
		wg.Go(func() {
			for i := range jobs {
				t := time.Now()
				err := s.run()
				lat[i] = time.Since(t)
				if err != nil {
					mu.Lock()
					first = cmpErr(first, err)
					mu.Unlock()
				}
			}
		})
	}
	for i := range runs {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	wall := time.Since(start)
	if first != nil {
		return first
	}
	if s.settle != nil {
		if err := s.settle(); err != nil {
			return err
		}
	}
	s.tput[k] = append(s.tput[k], float64(runs)/wall.Seconds())
	s.lat[k] = append(s.lat[k], lat...)
	s.cpuRun[k] = append(s.cpuRun[k], (s.cpu()-cpu0)/time.Duration(runs))
	s.host[k] = append(s.host[k], (hostBusy()-host0)/time.Duration(runs))
	return nil
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// checkCmd runs cmd and checks that it printed 45 (itself, or as the
// stdout of a result without error).
func checkCmd(cmd *exec.Cmd) error {
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("%v: %s", err, firstLine(string(out)))
	}
	got := string(out)
	if strings.HasPrefix(got, "{") {
		var r struct{ Stdout, Error string }
		if err := json.Unmarshal(out, &r); err != nil || r.Error != "" {
			return fmt.Errorf("result %s: %v", firstLine(got), err)
		}
		got = r.Stdout
	}
	if got != "45\n" {
		return fmt.Errorf("unexpected output %q", firstLine(got))
	}
	return nil
}

// childrenCPU is the user+sys time of this process's reaped children.
func childrenCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU is the user+sys time of process pid and of the children it has
// reaped (and so theirs, down the tree: every container's init and what it
// ran), from /proc/pid/stat.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	var ticks int64
	for _, i := range []int{11, 12, 13, 14} { // utime stime cutime cstime
		n, _ := strconv.ParseInt(f[i], 10, 64)
		ticks += n
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ
}

// hostBusy is the CPU time the whole host has spent not idle, from
// /proc/stat: it includes the kernel's own workers (cgroup and namespace
// tear-down), and whatever else runs on the host.
func hostBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)[1:]
	var busy int64
	for i, v := range f {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i != 3 && i != 4 && i < 8 { // not idle, iowait, guest
			busy += n
		}
	}
	return time.Duration(busy) * time.Second / 100
}

func medianF(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// loadReport writes the load section.
func loadReport(w io.Writer, subjects []*loadSubject) {
	if len(subjects) == 0 {
		return
	}
	fmt.Fprintf(w, "\n## Throughput under load\n\n")
	fmt.Fprintf(w, "print(45) run back to back by k clients at once (k goroutines of the bench; for serve, one in-process client per goroutine over the unix socket), %d runs per subject and k (runsc, cold and pooled: %d), %d rounds interleaved (round, then k, then subject, the subjects' order reversed every other round). runs/s: median over the rounds; p50/p99: over every run of every round, each timed to the whole answer; CPU: user+sys per run of everything the subject started (for serve: the server and every process it reaped, each container's init and program among them; bare and the CLI: the bench's reaped children), median over the rounds, measured until the server is idle again with its pool refilled; host: all of the host's busy CPU per run over the same span (kernel workers included, and anything else running then). Load average before: %s.\n\n",
		*loadRuns, max(8, *loadRuns/4), *loadRounds, loadStart)
	fmt.Fprintln(w, "| subject | k | runs/s | × bare | p50 | p99 | CPU/run | host CPU/run | note |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	bare := subjects[0]
	for _, s := range subjects {
		if s.err != "" {
			fmt.Fprintf(w, "| %s | – | – | – | – | – | – | – | not measured: %s |\n", s.name, strings.ReplaceAll(firstLine(s.err), "|", "/"))
			continue
		}
		for _, k := range concurrencies {
			if len(s.tput[k]) == 0 {
				continue
			}
			rel := "–"
			if b := medianF(bare.tput[k]); b > 0 {
				rel = fmt.Sprintf("%.2f×", medianF(s.tput[k])/b)
			}
			fmt.Fprintf(w, "| %s | %d | %.1f | %s | %s | %s | %s | %s | %s |\n", s.name, k, medianF(s.tput[k]), rel,
				ms(median(s.lat[k])), ms(pct(s.lat[k], 0.99)), ms(median(s.cpuRun[k])), ms(median(s.host[k])), s.note)
		}
	}
	loadTargets(w, subjects)
}

// loadTargets reports where the load section stands against its targets.
func loadTargets(w io.Writer, subjects []*loadSubject) {
	get := func(prefix string) *loadSubject {
		for _, s := range subjects {
			if strings.HasPrefix(s.name, prefix) && s.err == "" {
				return s
			}
		}
		return nil
	}
	bare, noPool, pool, runsc := get("bare"), get("agentrun serve, no pool"), get("agentrun serve, pool"), get(pooledRunscName)
	fmt.Fprintf(w, "\nWhere the load section stands against its targets (medians of this run):\n\n| target | measured | met |\n|---|---|---|\n")
	yes := map[bool]string{true: "yes", false: "no"}
	if bare != nil && runsc != nil {
		r := float64(median(runsc.lat[1])) / float64(median(bare.lat[1]))
		fmt.Fprintf(w, "| pooled runsc print(45) p50 at k=1 ≤ 3× bare | %.2f× | %s |\n", r, yes[r <= 3])
	}
	if bare == nil || pool == nil || noPool == nil {
		fmt.Fprintf(w, "| the rest | not measured | – |\n")
		return
	}
	r := medianF(pool.tput[4]) / medianF(bare.tput[4])
	fmt.Fprintf(w, "| serve with pool at k=4 ≥ 0.5× bare's runs/s | %.2f×%s | %s |\n", r, roundSpread(pool.tput[4], bare.tput[4]), yes[r >= 0.5])
	var worst []string
	ok := true
	for _, k := range concurrencies {
		p, n := medianF(pool.tput[k]), medianF(noPool.tput[k])
		worst = append(worst, fmt.Sprintf("k=%d %.2f×%s", k, p/n, roundSpread(pool.tput[k], noPool.tput[k])))
		ok = ok && p >= n
	}
	fmt.Fprintf(w, "| serve with pool ≥ serve without, every k | %s | %s |\n", strings.Join(worst, ", "), yes[ok])
	r = float64(median(pool.lat[1])) / float64(median(bare.lat[1]))
	fmt.Fprintf(w, "| pooled p50 at k=1, back to back, ≤ 1.3× bare | %.2f× | %s |\n", r, yes[r <= 1.3])
	c, b := median(pool.cpuRun[1]), median(bare.cpuRun[1])
	fmt.Fprintf(w, "| CPU per pooled run at k=1 ≤ bare + 15 ms | %+.1f ms (%.1f against %.1f) | %s |\n",
		float64(c-b)/1e6, float64(c)/1e6, float64(b)/1e6, yes[c-b <= 15*time.Millisecond])
}

// roundSpread is " (rounds LO–HI×)": the lowest and highest ratio of a
// to b within one round (the two were measured in the same round, one
// after the other), so that a target met or missed by less than the
// rounds' spread reads as such; "" with fewer than two rounds.
func roundSpread(a, b []float64) string {
	lo, hi, n := 0.0, 0.0, 0
	for i := range min(len(a), len(b)) {
		if b[i] <= 0 {
			continue
		}
		r := a[i] / b[i]
		if n == 0 || r < lo {
			lo = r
		}
		if n == 0 || r > hi {
			hi = r
		}
		n++
	}
	if n < 2 {
		return ""
	}
	return fmt.Sprintf(" (rounds %.2f–%.2f×)", lo, hi)
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:3], " ")
}

// filtered reports whether -load-filter keeps the subject name: it
// contains the filter, or one of its |-separated parts.
func filtered(name string) bool {
	return slices.ContainsFunc(strings.Split(*loadFilter, "|"), func(part string) bool { return strings.Contains(name, part) })
}
