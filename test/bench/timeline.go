package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// timelinePerf is -timeline: test/bench/timeline.sh records the kernel's
// process events (exec, fork, exit) of interleaved cold runs and gives the
// `perf script` output here.
var timelinePerf = flag.String("timeline", "", "print the median wall-time timeline of the cold runs in this `perf script -F comm,pid,tid,time,event,trace` output of sched:sched_process_exec/fork/exit events (test/bench/timeline.sh), the -agentrun binary's against runc's, and exit")

// procEvent is one sched event of `perf script`.
type procEvent struct {
	comm       string
	pid, tid   int
	ms         float64
	event      string // sched_process_exec, _fork or _exit
	rest       string
	groupDead  bool
	execedFile string
}

var procEventLine = regexp.MustCompile(`^\s*(.*?)\s+(\d+)/(\d+)\s+([0-9.]+):\s+sched:(sched_process_\w+):\s+(.*)$`)

// parseProcEvents reads the events of r, in order.
func parseProcEvents(r io.Reader) ([]procEvent, error) {
	var out []procEvent
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m := procEventLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[2])
		tid, _ := strconv.Atoi(m[3])
		sec, err := strconv.ParseFloat(m[4], 64)
		if err != nil {
			continue
		}
		e := procEvent{comm: m[1], pid: pid, tid: tid, ms: sec * 1000, event: m[5], rest: m[6],
			groupDead: strings.Contains(m[6], "group_dead=true")}
		if e.event == "sched_process_exec" {
			if f, ok := strings.CutPrefix(m[6], "filename="); ok {
				e.execedFile, _, _ = strings.Cut(f, " ")
			}
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// coldRunSteps are a cold run's steps as its process events show them,
// in the order they happen: the CLI's exec starts a run, its exit ends it.
var coldRunSteps = []string{
	"the CLI's first thread (its Go runtime is up)",
	"the container's init executed (libcontainer's sealed binary)",
	"nsexec starts (the init has its bootstrap data)",
	"nsexec done (the namespaces made)",
	"the init's first thread (its Go runtime is up)",
	"agentrun-seccomp executed (the init's set-up done)",
	"tini executed",
	"python3 executed",
	"python3 exited",
	"tini exited",
	"the CLI exited",
}

// coldRun is one run's steps, in ms from its CLI's exec.
type coldRun struct {
	runc  bool
	steps map[string]float64
}

// coldRuns splits events into the runs of agentrun (the binary at
// agentrun, by its exec's file name) and of runc (a file named runc).
func coldRuns(events []procEvent, agentrun string) []coldRun {
	var runs []coldRun
	var cur *coldRun
	var t0 float64
	var cli int
	mark := func(step string, ms float64) {
		if _, ok := cur.steps[step]; !ok {
			cur.steps[step] = ms - t0
		}
	}
	for _, e := range events {
		if e.event == "sched_process_exec" && (e.execedFile == agentrun || filepath.Base(e.execedFile) == "runc") {
			runs = append(runs, coldRun{runc: e.execedFile != agentrun, steps: map[string]float64{}})
			cur, t0, cli = &runs[len(runs)-1], e.ms, e.pid
			continue
		}
		if cur == nil {
			continue
		}
		switch e.event {
		case "sched_process_exec":
			switch f := e.execedFile; {
			case f == "/proc/self/exe" && cur.runc:
				// runc 1.1's own copy into a memfd follows; its exec of
				// that is the init's.
			case strings.HasPrefix(f, "/proc/self/fd/") || strings.HasPrefix(f, "/dev/fd/"):
				mark(coldRunSteps[1], e.ms)
			case filepath.Base(f) == "agentrun-seccomp":
				mark(coldRunSteps[5], e.ms)
			case f == "/dev/init":
				mark(coldRunSteps[6], e.ms)
			case filepath.Base(f) == "python3":
				mark(coldRunSteps[7], e.ms)
			}
		case "sched_process_fork":
			switch {
			case e.pid == cli:
				mark(coldRunSteps[0], e.ms)
			case strings.HasPrefix(e.comm, "runc:[0:PARENT]"):
				mark(coldRunSteps[2], e.ms)
			case strings.HasPrefix(e.comm, "runc:[2:INIT]"):
				mark(coldRunSteps[4], e.ms)
			}
		case "sched_process_exit":
			switch {
			case strings.HasPrefix(e.comm, "runc:[0:PARENT]"):
				mark(coldRunSteps[3], e.ms)
			case e.comm == "python3":
				mark(coldRunSteps[8], e.ms)
			case e.comm == "init" && e.groupDead:
				mark(coldRunSteps[9], e.ms)
			case e.pid == cli && e.groupDead:
				mark(coldRunSteps[10], e.ms)
				cur = nil
			}
		}
	}
	return runs
}

// timelineReport writes the median of each step for agentrun's runs and
// runc's, with the step before it subtracted, as a markdown table.
func timelineReport(w io.Writer, runs []coldRun) {
	med := func(runc bool, step string) (float64, int) {
		var v []float64
		for _, r := range runs {
			if d, ok := r.steps[step]; ok && r.runc == runc {
				v = append(v, d)
			}
		}
		if len(v) == 0 {
			return 0, 0
		}
		slices.Sort(v)
		if len(v)%2 == 1 {
			return v[len(v)/2], len(v)
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2, len(v)
	}
	count := func(runc bool) int {
		n := 0
		for _, r := range runs {
			if r.runc == runc {
				n++
			}
		}
		return n
	}
	fmt.Fprintf(w, "Median ms from the CLI's exec (in brackets: since the step before); %d agentrun runs, %d runc runs.\n\n", count(false), count(true))
	fmt.Fprintln(w, "| step | agentrun run | runc run |")
	fmt.Fprintln(w, "|---|---|---|")
	prev := [2]float64{}
	for _, step := range coldRunSteps {
		cells := [2]string{"–", "–"}
		for i, runc := range []bool{false, true} {
			if m, n := med(runc, step); n > 0 {
				cells[i] = fmt.Sprintf("%.1f (+%.1f)", m, m-prev[i])
				prev[i] = m
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s |\n", step, cells[0], cells[1])
	}
}

// runTimeline is -timeline: it reads the file, prints the report and
// exits.
func runTimeline(path, agentrun string) {
	f, err := os.Open(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer f.Close()
	events, err := parseProcEvents(f)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	abs, err := filepath.Abs(agentrun)
	if err != nil {
		abs = agentrun
	}
	timelineReport(os.Stdout, coldRuns(events, abs))
	os.Exit(0)
}
