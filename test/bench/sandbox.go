package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/server"
)

var sandboxOnly = flag.Bool("sandbox-only", false, "measure the live sandbox section only (against a pooled run, runc exec and bare sh) and print it (docs/bench.md is not written)")

// Names of the live sandbox section's contenders.
const (
	sbPooledName = "agentrun serve, warm pool: POST /v1/runs print(45)"
	sbCreateName = "live sandbox: create, then python3 -c print(45), to its first output"
	sbPoolName   = "live sandbox from the pool: create, then python3 -c print(45), to its first output"
	sbExecName   = "live sandbox: exec true"
	runcExecName = "runc exec true (CLI, a running container)"
	shTrueName   = "bare chroot sh -c true"
)

// The live sandbox section's bounds.
const (
	sbMany       = 32               // live at once
	sbParallel   = 4                // calls at once while making or using them
	sbCallLimit  = 60 * time.Second // one API call
	sbCgroup     = "/agentrun-bench-sandboxes"
	sbLiveRuncID = "bench-live"
)

// sandboxSection is what the live sandbox section measured.
type sandboxSection struct {
	err  string
	cs   []*contender
	idle sbMemory // the exec contender's sandbox, idle
	many manySandboxes
}

// sbMemory is the memory of live sandboxes: their cgroups' usage
// (kernel memory and page cache charged to them included), the
// processes in them (their own anonymous memory, and their resident
// memory, shared pages counted in each), and how much serve's own grew
// with them; bytes.
type sbMemory struct {
	n      int // sandboxes
	cgroup int64
	procs  int64 // RssAnon: what they alone hold, charged to their cgroup
	rss    int64 // VmRSS: shared pages (the image's libraries) counted in each
	nprocs int
	serve  int64
	err    string
}

// beyond is what n sandboxes take beyond their processes, per sandbox:
// their cgroups' usage less their processes' own memory, plus serve's
// growth, divided by n.
func (m sbMemory) beyond() int64 {
	if m.n == 0 {
		return 0
	}
	return (m.cgroup - m.procs + m.serve) / int64(m.n)
}

// manySandboxes is sbMany live sandboxes at once, each with an idle
// shell.
type manySandboxes struct {
	create, exec, del time.Duration
	mem               sbMemory
	left              string // what their deletion left, "" for nothing
	err               string
}

// sandboxBench measures live sandboxes on an `agentrun serve` of their
// own (no pool, its cgroups under sbCgroup so that they are found) and
// on one whose pool keeps a live sandbox ready, interleaved: a sandbox
// created and its first output (python3 -c print(45)), from nothing and
// from the pool, beside a pooled run of print(45) on pool, `true`
// exec'd in a live sandbox beside `runc exec` in a running container of
// the runc contender's spec and bare sh;
// then the memory of an idle one, and sbMany at once.
func sandboxBench(work, rootfs, task string, pool *served, poolErr error) *sandboxSection {
	ss := &sandboxSection{}
	cfg := filepath.Join(work, "sandbox-config.json")
	sock := filepath.Join(work, "sandbox.sock")
	state := filepath.Join(work, "sandbox-state")
	write(cfg, fmt.Sprintf(`{"image":"dir:%s","audit":"","state_dir":%q,"store_dir":%q,"cgroup_parent":%q,
		"policy":{"local_images":[%q]},
		"sandboxes":{"max":%d},
		"server":{"listen":%q,"max_concurrent":8,"queue":64,"quota":{"runs_per_minute":0,"concurrent":0}}}`,
		rootfs, state, filepath.Join(work, "sandbox-store"), sbCgroup, filepath.Dir(filepath.Dir(rootfs)), sbMany+8, "unix://"+sock))
	s, err := launchServe(*bin, cfg, sock)
	if err != nil {
		ss.err = fmt.Sprintf("agentrun serve: %v", err)
		return ss
	}
	defer s.stop()
	ctx := context.Background()

	rss0 := s.rss()
	live, err := s.client.CreateSandbox(ctx, server.SandboxRequest{Timeout: config.MustDuration("30m")})
	if err != nil {
		ss.err = fmt.Sprintf("creating a live sandbox: %v", err)
		return ss
	}
	serveGrew := s.rss() - rss0
	defer s.client.DeleteSandbox(ctx, live.ID)

	// A serve whose pool serves live sandboxes alone: its first create
	// moves the pool to their shape (it follows the shapes it is asked
	// for), which it keeps ready from then on.
	sp, spErr := startServeAs(*bin, work, rootfs, "sandbox-pool", 1)
	if sp != nil {
		defer sp.stop()
	}
	if spErr == nil {
		if _, _, err := sp.createToFirstOutput(); err != nil {
			spErr = fmt.Errorf("a first live sandbox: %w", err)
		}
	}

	rc, stopRunc := runcLiveContender(work, rootfs, task)
	defer stopRunc()
	ss.cs = []*contender{
		pool.pooled(&contender{name: sbPooledName, note: "a pooled print(45), timed to the whole answer (spaced: the pool refilled before each run)"}, poolErr, pool.post),
		{name: sbCreateName, note: "POST /v1/sandboxes on a serve without a pool (each made from nothing), then POST …/processes, timed to its first stdout event; deleted after, untimed",
			call: func(int) (time.Duration, string, error) { return s.createToFirstOutput() }},
		sp.pooledSandbox(&contender{name: sbPoolName, note: "the same on a serve with a pool of one, which keeps a live sandbox's shape ready (spaced: the pool refilled before each create)"}, spErr),
		{name: sbExecName, quiet: true, note: "POST …/processes {command: [true]} in a running live sandbox over the unix socket, timed to its exit event",
			call: func(int) (time.Duration, string, error) { return s.execTrue(live.ID) }},
		rc,
		{name: shTrueName, quiet: true, note: "the floor: a process start and exit, no isolation",
			cmd: func(int) *exec.Cmd { return exec.Command("chroot", rootfs, "/bin/sh", "-c", "true") }},
	}
	measure(ss.cs)

	var old map[string]bool
	ss.idle, old = s.memory(nil)
	ss.idle.serve = serveGrew
	ss.many = s.many(old)
	return ss
}

// call is a context for one API call.
func call() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), sbCallLimit)
}

// createToFirstOutput creates a sandbox, runs python3 -c print(45) in it
// and times both to its first stdout event; it deletes it after, untimed.
func (s *served) createToFirstOutput() (time.Duration, string, error) {
	return s.createThenExec([]string{"python3", "-c", "print(45)"}, true)
}

// createThenExec creates a sandbox, runs argv in it and times both to its
// first stdout event (first) or to its exit event; it deletes it after,
// untimed.
func (s *served) createThenExec(argv []string, first bool) (time.Duration, string, error) {
	ctx, cancel := call()
	defer cancel()
	start := time.Now()
	info, err := s.client.CreateSandbox(ctx, server.SandboxRequest{})
	if err != nil {
		return 0, "", fmt.Errorf("create: %w", err)
	}
	var el time.Duration
	var out strings.Builder
	exit, err := s.client.Exec(ctx, info.ID, server.ProcessRequest{Command: argv}, func(e runapi.ProcessEvent) error {
		if e.Event == "stdout" || e.Event == "stderr" {
			if first && el == 0 && e.Event == "stdout" {
				el = time.Since(start)
			}
			b, err := e.Output()
			out.Write(b)
			return err
		}
		return nil
	})
	if !first {
		el = time.Since(start)
	}
	if derr := s.client.DeleteSandbox(ctx, info.ID); err == nil && derr != nil {
		err = fmt.Errorf("delete: %w", derr)
	}
	if err == nil {
		err = exitErr(exit)
	}
	return el, out.String(), err
}

// pooledSandbox is c timing createToFirstOutput on s, whose pool keeps a
// live sandbox ready: each create waits for the pool to have refilled,
// and fails unless the pool served it.
func (s *served) pooledSandbox(c *contender, err error) *contender {
	return s.poolHit(c, err, s.createToFirstOutput)
}

// poolHit is c timing f, which creates a sandbox on s, whose pool keeps
// one ready: each call waits for the pool to have refilled, untimed, and
// fails unless the pool served its create (one more hit).
func (s *served) poolHit(c *contender, err error, f func() (time.Duration, string, error)) *contender {
	if err != nil {
		c.err = err.Error()
		return c
	}
	hits := func() (int64, error) {
		h, err := s.client.Health(context.Background())
		if err != nil || h.Pool == nil {
			return 0, fmt.Errorf("the server's pool: %v", err)
		}
		return h.Pool.Hits, nil
	}
	c.call = func(int) (time.Duration, string, error) {
		if err := s.waitReady(); err != nil {
			return 0, "", err
		}
		before, err := hits()
		if err != nil {
			return 0, "", err
		}
		el, out, err := f()
		if err != nil {
			return 0, "", err
		}
		if after, err := hits(); err != nil || after != before+1 {
			return 0, "", fmt.Errorf("the sandbox was not taken from the pool (hits %d, then %d: %v)", before, after, err)
		}
		return el, out, nil
	}
	return c
}

// execTrue runs true in sandbox id, timed to its exit event.
func (s *served) execTrue(id string) (time.Duration, string, error) {
	return s.execTimed(id, []string{"true"})
}

// execTimed runs argv in sandbox id, timed to its exit event, and returns
// its output.
func (s *served) execTimed(id string, argv []string) (time.Duration, string, error) {
	ctx, cancel := call()
	defer cancel()
	var out strings.Builder
	start := time.Now()
	exit, err := s.client.Exec(ctx, id, server.ProcessRequest{Command: argv}, func(e runapi.ProcessEvent) error {
		b, err := e.Output()
		out.Write(b)
		return err
	})
	el := time.Since(start)
	if err == nil {
		err = exitErr(exit)
	}
	return el, out.String(), err
}

// exitErr is why exit is not a process's exit with status 0.
func exitErr(exit runapi.ProcessEvent) error {
	if exit.Event != "exit" || exit.ExitCode == nil || *exit.ExitCode != 0 {
		return fmt.Errorf("process ended as %+v", exit)
	}
	return nil
}

// runcLiveContender is `runc exec ID true` in a container of the runc
// contender's spec whose program is a sleep loop (the live sandbox's
// holder), started with `runc run -d`; stop kills and deletes it.
func runcLiveContender(work, rootfs, task string) (*contender, func()) {
	c := &contender{name: runcExecName, quiet: true, note: "Debian's runc " + version("runc", "--version") + ": `runc exec ID true` in a container of the same hardened spec, started with `runc run -d`, its program a sleep loop"}
	root := filepath.Join(work, "runc-live-state")
	runc := func(args ...string) *exec.Cmd {
		return exec.Command("runc", append([]string{"--root", root}, args...)...)
	}
	bundle, err := runcBundleOf(work, rootfs, task, "bundle-live", []string{"/bin/sh", "-c", "while :; do sleep 3600; done"})
	if err != nil {
		c.err = fmt.Sprintf("runc bundle: %v", err)
		return c, func() {}
	}
	// The container keeps runc's stdio: files, not pipes, whose end
	// would never come.
	log := filepath.Join(work, "runc-live.log")
	out, err := os.Create(log)
	if err != nil {
		c.err = err.Error()
		return c, func() {}
	}
	defer out.Close()
	start := runc("run", "-d", "--bundle", bundle, sbLiveRuncID)
	start.Stdout, start.Stderr = out, out
	if err := start.Run(); err != nil {
		b, _ := os.ReadFile(log)
		c.err = fmt.Sprintf("runc run -d: %v: %s", err, firstLine(string(b)))
		runc("delete", "-f", sbLiveRuncID).Run()
		return c, func() {}
	}
	c.cmd = func(int) *exec.Cmd { return runc("exec", sbLiveRuncID, "true") }
	return c, func() { runc("delete", "-f", sbLiveRuncID).Run() }
}

// many creates sbMany sandboxes, sbParallel at a time, each with an idle
// shell (sh, its stdin kept open), execs true in each, reads their
// memory (that of the cgroups in old, there before, not counted),
// deletes them all and checks that nothing of them is left.
func (s *served) many(old map[string]bool) manySandboxes {
	var m manySandboxes
	there := s.census()
	before := s.rss()
	ids := make([]string, sbMany)
	start := time.Now()
	err := parallel(sbMany, func(i int) error {
		ctx, cancel := call()
		defer cancel()
		info, err := s.client.CreateSandbox(ctx, server.SandboxRequest{})
		if err != nil {
			return fmt.Errorf("create: %w", err)
		}
		ids[i] = info.ID
		if _, err := s.client.Start(ctx, info.ID, server.ProcessRequest{Command: []string{"sh"}, Stdin: true}); err != nil {
			return fmt.Errorf("starting its shell: %w", err)
		}
		return nil
	})
	m.create = time.Since(start)
	if err == nil {
		start = time.Now()
		err = parallel(sbMany, func(i int) error {
			_, _, err := s.execTrue(ids[i])
			return err
		})
		m.exec = time.Since(start)
	}
	if err == nil {
		m.mem, _ = s.memory(old)
		m.mem.serve = s.rss() - before
	}
	start = time.Now()
	derr := parallel(sbMany, func(i int) error {
		if ids[i] == "" {
			return nil
		}
		ctx, cancel := call()
		defer cancel()
		return s.client.DeleteSandbox(ctx, ids[i])
	})
	m.del = time.Since(start)
	if err = errors.Join(err, derr); err != nil {
		m.err = err.Error()
	}
	m.left = there.left(s.census())
	return m
}

// parallel calls f(0) to f(n-1), sbParallel at a time, and returns their
// errors joined.
func parallel(n int, f func(i int) error) error {
	errs := make([]error, n)
	sem := make(chan struct{}, sbParallel)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs[i] = f(i)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// memory reads the memory of the live sandboxes there are now, but
// those whose cgroups skip names: the usage of each cgroup under
// sbCgroup and the resident memory of the processes in it. It returns
// the names of the cgroups it read too.
func (s *served) memory(skip map[string]bool) (sbMemory, map[string]bool) {
	var m sbMemory
	read := map[string]bool{}
	dir := memoryCgroupDir()
	ents, err := os.ReadDir(dir)
	if err != nil {
		m.err = err.Error()
		return m, read
	}
	for _, e := range ents {
		if !e.IsDir() || skip[e.Name()] {
			continue
		}
		read[e.Name()] = true
		cg := filepath.Join(dir, e.Name())
		usage, err := readInt(filepath.Join(cg, memoryUsageFile(dir)))
		if err != nil {
			m.err = err.Error()
			return m, read
		}
		m.n++
		m.cgroup += usage
		procs, _ := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
		for _, p := range strings.Fields(string(procs)) {
			status, err := os.ReadFile(filepath.Join("/proc", p, "status"))
			if err != nil {
				continue // gone meanwhile
			}
			anon, ok := statusKB(string(status), "RssAnon")
			rss, ok2 := statusKB(string(status), "VmRSS")
			if ok && ok2 {
				m.procs += anon << 10
				m.rss += rss << 10
				m.nprocs++
			}
		}
	}
	return m, read
}

// memoryCgroupDir is sbCgroup in the memory controller's hierarchy.
func memoryCgroupDir() string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return filepath.Join("/sys/fs/cgroup", sbCgroup)
	}
	return filepath.Join("/sys/fs/cgroup/memory", sbCgroup)
}

// memoryUsageFile is the name of a cgroup's memory usage under dir's
// hierarchy: v2's memory.current or v1's memory.usage_in_bytes.
func memoryUsageFile(dir string) string {
	if strings.HasPrefix(dir, "/sys/fs/cgroup/memory/") {
		return "memory.usage_in_bytes"
	}
	return "memory.current"
}

// census is what live sandboxes leave on the host, counted: the
// sandboxes serve lists, the cgroups under sbCgroup in every hierarchy,
// the mounts under serve's state dir.
type census struct {
	listed, cgroups, mounts int
	err                     error
}

// census counts what there is now.
func (s *served) census() census {
	var c census
	ctx, cancel := call()
	defer cancel()
	list, err := s.client.Sandboxes(ctx)
	c.listed, c.err = len(list), err
	roots, _ := filepath.Glob("/sys/fs/cgroup/*" + sbCgroup)
	for _, r := range append(roots, filepath.Join("/sys/fs/cgroup", sbCgroup)) {
		ents, _ := os.ReadDir(r)
		for _, e := range ents {
			if e.IsDir() {
				c.cgroups++
			}
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	c.mounts = strings.Count(string(mounts), " "+filepath.Join(filepath.Dir(s.sock), "sandbox-state")+"/")
	return c
}

// left says what after holds beyond c, "" for nothing.
func (c census) left(after census) string {
	var left []string
	if err := errors.Join(c.err, after.err); err != nil {
		left = append(left, fmt.Sprintf("listing sandboxes: %v", err))
	}
	for _, d := range []struct {
		what     string
		was, now int
	}{{"sandboxes listed", c.listed, after.listed}, {"cgroups", c.cgroups, after.cgroups}, {"mounts", c.mounts, after.mounts}} {
		if d.now > d.was {
			left = append(left, fmt.Sprintf("%d %s", d.now-d.was, d.what))
		}
	}
	return strings.Join(left, ", ")
}

// rss is the server's resident memory now, bytes.
func (s *served) rss() int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	kb, _ := statusKB(string(b), "VmRSS")
	return kb << 10
}

// statusKB is field's value in a /proc/PID/status, in kB.
func statusKB(status, field string) (int64, bool) {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

func readInt(p string) (int64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// sandboxReport prints the live sandbox section.
func sandboxReport(w io.Writer, ss *sandboxSection) {
	fmt.Fprintf(w, "\n## Live sandboxes\n\n")
	if ss.err != "" {
		fmt.Fprintf(w, "Not measured: %s\n", ss.err)
		return
	}
	fmt.Fprintf(w, "Live sandboxes ([sandboxes.md](sandboxes.md)) on an `agentrun serve` of their own (no pool), and on one whose pool of one keeps a live sandbox ready, over their unix sockets, beside a pooled run (serve with a pool of one), `runc exec` in a running container and bare sh; %d runs per contender, interleaved, the order reversed every other time.\n\n", *n)
	cpuTable(w, ss.cs)
	if m := ss.idle; m.err != "" {
		fmt.Fprintf(w, "\nAn idle live sandbox's memory: not measured: %s\n", m.err)
	} else {
		fmt.Fprintf(w, "\nAn idle live sandbox (its holder, after the execs above): its cgroup uses %s, its %d processes hold %s of their own (%s resident); serve grew by %s when it was made: %s beyond its processes.\n",
			mib(m.cgroup), m.nprocs, mib(m.procs), mib(m.rss), mib(m.serve), mib(m.beyond()))
	}
	mm := ss.many
	fmt.Fprintf(w, "\n%d live sandboxes at once, %d calls at a time, each with an idle shell (`sh`, its stdin kept open): ", sbMany, sbParallel)
	if mm.err != "" {
		fmt.Fprintf(w, "not measured: %s", strings.ReplaceAll(firstLine(mm.err), "|", "/"))
	} else {
		fmt.Fprintf(w, "made with their shells in %s, `true` in each in %s, all deleted in %s; their cgroups use %s, their %d processes hold %s of their own (%s resident), serve grew by %s: %s each beyond their processes.",
			ms(mm.create), ms(mm.exec), ms(mm.del), mib(mm.mem.cgroup), mm.mem.nprocs, mib(mm.mem.procs), mib(mm.mem.rss), mib(mm.mem.serve), mib(mm.mem.beyond()))
	}
	if mm.left == "" {
		fmt.Fprintln(w, " Once deleted, nothing of them was left (serve's list, cgroups, mounts).")
	} else {
		fmt.Fprintf(w, " Left after their deletion: %s.\n", mm.left)
	}
	fmt.Fprintln(w, "\nBeyond its processes: the cgroup's usage (the memory controller's: the processes' anonymous memory, the kernel's memory for them, the page cache and tmpfs pages charged to it) less the processes' own anonymous memory (RssAnon), plus serve's growth in resident memory (Go's heap included) per sandbox. Resident memory counts the image's shared libraries in each process, so it is given beside, not subtracted; a file page is charged to the cgroup that read it first.")
	fmt.Fprintf(w, "\nWhere this run stands against the targets (medians of this run):\n\n| target | measured | met |\n|---|---|---|\n")
	for _, t := range sandboxTargets(ss) {
		fmt.Fprintf(w, "| %s | %s | %s |\n", t[0], t[1], t[2])
	}
}

// sandboxTargets are the section's targets: each its name, what was
// measured and whether it was met (yes, no, or – when not measured).
func sandboxTargets(ss *sandboxSection) [][3]string {
	met := map[bool]string{true: "yes", false: "no"}
	against := func(target, a, b string, max float64) [3]string {
		ca, cb := find(ss.cs, a), find(ss.cs, b)
		if ca.err != "" || cb.err != "" || len(ca.times) == 0 || len(cb.times) == 0 {
			return [3]string{target, "not measured", "–"}
		}
		r := float64(median(ca.times)) / float64(median(cb.times))
		return [3]string{target, fmt.Sprintf("%.2f× (%s against %s)", r, ms(median(ca.times)), ms(median(cb.times))), met[r <= max]}
	}
	ts := [][3]string{
		against("live sandbox from the pool: create to first output ≤ 2× a pooled run's answer", sbPoolName, sbPooledName, 2),
		against("live sandbox exec `true` ≤ 1.5× `runc exec` in a running container", sbExecName, runcExecName, 1.5),
	}
	if c, b := find(ss.cs, sbExecName), find(ss.cs, shTrueName); c.err == "" && b.err == "" && len(c.times) > 0 && len(b.times) > 0 {
		ts = append(ts, [3]string{"(no target) live sandbox exec `true` against bare sh", fmt.Sprintf("%.2f×", float64(median(c.times))/float64(median(b.times))), "–"})
	}
	idle := "idle live sandbox ≤ 5 MiB beyond its processes"
	if m := ss.many; m.err != "" || m.mem.err != "" || m.mem.n == 0 {
		ts = append(ts, [3]string{idle, "not measured", "–"})
	} else {
		b := m.mem.beyond()
		ts = append(ts, [3]string{idle, fmt.Sprintf("%s each over %d (cgroups less processes, plus serve's growth)", mib(b), m.mem.n), met[b <= 5<<20]})
	}
	clean := fmt.Sprintf("%d live sandboxes at once leave nothing once deleted", sbMany)
	switch {
	case ss.many.err != "":
		ts = append(ts, [3]string{clean, "not measured", "–"})
	case ss.many.left != "":
		ts = append(ts, [3]string{clean, ss.many.left, "no"})
	default:
		ts = append(ts, [3]string{clean, "nothing left", "yes"})
	}
	return ts
}
