// Command bench measures agentrun against the floor (bare chroot python3)
// and its peers (runc run of an equivalent hardened bundle, bwrap) on the
// same print(45) task, interleaved in one invocation, and writes the table
// to docs/bench.md. Run it as root through `make bench`.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/runner"
	agtask "github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/runtime/cgroup"
	"github.com/agentrun/agentrun/runtime/spec"
)

var (
	n        = flag.Int("n", 30, "runs per contender")
	bin      = flag.String("agentrun", "bin/agentrun", "agentrun binary")
	images   = flag.String("images", envOr("AGENTRUN_IMAGES", "/var/cache/agentrun/images"), "test images (test/images/build.sh)")
	runscBin = flag.String("runsc", envOr("AGENTRUN_RUNSC", "/var/cache/agentrun/bin/runsc"), "runsc binary (optional)")
	runcLC   = flag.String("runc-libcontainer", "", "runc CLI built at the libcontainer version agentrun links (test/runc.sh; optional)")
	out      = flag.String("out", "docs/bench.md", "markdown report")
	allow    = flag.String("allow", "example.test", "allowlist entry for the allowlist contender")
	keepWork = flag.Bool("keep-work", false, "keep the work dir (the bundle, configs and tasks the contenders ran) and log its path, to rerun a contender by hand")
	coldOnly = flag.Bool("cold-only", false, "measure the floor, the kernel floor, both runc CLIs and a cold agentrun run only, and print them (docs/bench.md is not written)")
)

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// Names of the contenders the targets are about.
const (
	runcName     = "runc run (CLI)"
	runcLCName   = "runc run (CLI, agentrun's libcontainer)"
	coldName     = "agentrun run (cold, no network)"
	baseColdName = "baseline agentrun run (cold, no network)"
	allowName    = "agentrun run (allowlist)"
	warmName     = "agentrun serve, warm pool"
	cliName      = "agentrun run --server, warm pool"
)

// concurrencies are those throughput is measured at.
var concurrencies = []int{1, 4, 8}

// contender is one way of running print(45): a command, or a call in this
// process.
type contender struct {
	name string
	note string
	cmd  func(i int) *exec.Cmd
	// call runs once and returns the time it took and the program's stdout.
	call  func(i int) (time.Duration, string, error)
	times []time.Duration
	// cpu is the user+sys time of each run of cmd and of the processes it
	// waited for, down the tree (RUSAGE_CHILDREN); none for a call.
	cpu    []time.Duration
	rss    int64 // peak RSS of the measured process, KiB
	rssErr error
	err    string
	// quiet is a contender whose run prints nothing (true): its stdout
	// must be empty instead of 45.
	quiet bool
}

func main() {
	flag.Parse()
	log.SetFlags(0)
	if *foldPerf != "" {
		runFold(*foldPerf, *bin)
	}
	if *timelinePerf != "" {
		runTimeline(*timelinePerf, *bin)
	}
	if os.Geteuid() != 0 {
		log.Fatal("bench must run as root")
	}
	rootfs := filepath.Join(*images, "python", "rootfs")
	work, err := os.MkdirTemp("", "agentrun-bench-")
	if err != nil {
		log.Fatal(err)
	}
	if *keepWork {
		defer log.Printf("work dir kept: %s", work)
	} else {
		defer os.RemoveAll(work)
	}
	for _, b := range []string{*bin, *baseline} {
		if err := checkSealable(b, work); err != nil {
			log.Fatal(err)
		}
	}
	// The binaries measured run from copies, as an installed binary does
	// (a package's or make install's copy): a linker's fresh output can
	// sit in the page cache as huge pages, each mapped whole at its first
	// touch, and so start with ~200 fewer page faults than any copy of
	// it, which runc's binary is too.
	for _, b := range []*string{bin, baseline} {
		if *b != "" {
			c, err := installCopy(*b, work)
			if err != nil {
				log.Fatal(err)
			}
			*b = c
		}
	}

	cfg := filepath.Join(work, "config.json")
	write(cfg, fmt.Sprintf(`{"image":"dir:%s","audit":"","state_dir":%q,"runsc":{"path":%q,"flags":[]}}`, rootfs, filepath.Join(work, "state"), *runscBin))
	task := filepath.Join(work, "task.json")
	write(task, `{"code":"print(45)"}`)
	allowTask := filepath.Join(work, "allow.json")
	write(allowTask, fmt.Sprintf(`{"code":"print(45)","network":{"allow":[%q]}}`, *allow))
	runscTask := filepath.Join(work, "runsc.json")
	write(runscTask, `{"code":"print(45)","runtime":"runsc"}`)

	if *loadOnly {
		loadReport(os.Stdout, loadBench(work, rootfs, cfg, task))
		return
	}
	if *warmOnly {
		warmReport(os.Stdout, warmBench(work))
		return
	}
	if *forkOnly {
		forkReport(os.Stdout, forkBench(work, rootfs))
		return
	}
	if *stateOnly {
		stateReport(os.Stdout, stateBench(work))
		return
	}
	if *sandboxOnly {
		srv, serr := startServe(work, rootfs)
		if srv != nil {
			defer srv.stop()
		}
		sandboxReport(os.Stdout, sandboxBench(work, rootfs, task, srv, serr))
		return
	}
	if *interpOnly {
		srv, serr := startServe(work, rootfs)
		if srv != nil {
			defer srv.stop()
		}
		interpReport(os.Stdout, interpBench(work, rootfs, srv, serr))
		return
	}

	bundle, err := runcBundle(work, rootfs, task)
	if err != nil {
		log.Fatalf("runc bundle: %v", err)
	}

	cs := []*contender{
		{name: "bare chroot python3", note: "the floor: no isolation at all",
			cmd: func(int) *exec.Cmd { return exec.Command("chroot", rootfs, "python3", "-c", "print(45)") }},
		floorContender(work, rootfs, cfg, task),
		{name: runcName, note: "Debian's runc " + version("runc", "--version") + ", the same hardened spec as agentrun",
			cmd: func(i int) *exec.Cmd {
				return exec.Command("runc", "--root", filepath.Join(work, "runc-state"), "run", "--bundle", bundle, fmt.Sprintf("bench-%d", i))
			}},
		runcLCContender(work, bundle),
		{name: "bwrap", note: "bubblewrap " + version("bwrap", "--version") + ": ro root, proc, dev, tmpfs /tmp, all namespaces unshared, caps dropped, uid 65534",
			cmd: func(int) *exec.Cmd {
				return exec.Command("bwrap", "--ro-bind", rootfs, "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
					"--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--uid", "65534", "--gid", "65534",
					"python3", "-c", "print(45)")
			}},
		{name: coldName, note: "one agentrun process per run, full hardening",
			cmd: func(int) *exec.Cmd { return exec.Command(*bin, "run", "--config", cfg, task) }},
		{name: allowName, note: "network.allow [" + *allow + "]: netns pair, veth, proxy and DNS",
			cmd: func(int) *exec.Cmd { return exec.Command(*bin, "run", "--config", cfg, allowTask) }},
		{name: "agentrun run (runsc)", note: "gVisor runsc, systrap",
			cmd: func(int) *exec.Cmd { return exec.Command(*bin, "run", "--config", cfg, runscTask) }},
		sessionContender(work, rootfs),
	}
	if *baseline != "" {
		cs = append(cs, baselineColdContender(work, rootfs, task))
		defer func() {
			if err := cgroup.RemoveEmpty(baselineCgroupParent); err != nil {
				log.Printf("removing the baseline's cgroup parent: %v", err)
			}
		}()
	}
	if *coldOnly {
		coldReport(os.Stdout, cs)
		return
	}
	srv, serr := startServe(work, rootfs)
	if srv != nil {
		defer srv.stop()
	}
	warm := poolContender(srv, serr)
	cs = append(cs, warm, cliContender(srv, serr, task))
	mcpCold, m1 := mcpColdContender(cfg)
	defer m1.close()
	mcpWarm, m2 := mcpWarmContender(srv, serr)
	defer m2.close()
	cs = append(cs, mcpCold, mcpWarm)

	measure(cs)

	for _, c := range cs {
		if c.err == "" && c.cmd != nil {
			c.rss, c.rssErr = peakRSS(c.cmd(*n + 1))
		}
	}
	if warm.err == "" {
		warm.rss = srv.peakRSS()
	}
	load := loadBench(work, rootfs, cfg, task)
	pulls := pullBench(work, filepath.Join(*images, "python", "oci"))
	gobench := goBenchmarks()
	via, direct, perr := proxyBench()
	nb := netBench{via: via, direct: direct, err: perr}
	ws := warmBench(work)
	fb := forkBench(work, rootfs)
	sb := stateBench(work)
	lb := sandboxBench(work, rootfs, task, srv, serr)
	ib := interpBench(work, rootfs, srv, serr)
	report(os.Stdout, cs, load, pulls, nb, gobench)
	warmReport(os.Stdout, ws)
	forkReport(os.Stdout, fb)
	stateReport(os.Stdout, sb)
	sandboxReport(os.Stdout, lb)
	interpReport(os.Stdout, ib)
	kept := keptSections(*out)
	f, err := os.Create(*out)
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	report(f, cs, load, pulls, nb, gobench)
	warmReport(f, ws)
	forkReport(f, fb)
	stateReport(f, sb)
	sandboxReport(f, lb)
	interpReport(f, ib)
	io.WriteString(f, kept)
}

// checkSealable refuses an agentrun binary whose directory holds the
// bench's work dir, where its runs keep their state: libcontainer cannot
// seal such a binary through overlayfs (the layers would overlap) and
// copies it into a memfd for every container instead, which costs a run
// as much as the rest of its set-up and would skew every comparison.
func checkSealable(bin, work string) error {
	if bin == "" {
		return nil
	}
	abs, err := filepath.Abs(bin)
	if err != nil {
		return err
	}
	dir := filepath.Dir(abs)
	if rel, err := filepath.Rel(dir, work); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
		return fmt.Errorf("%s: its directory %s holds the bench's work dir %s, so libcontainer would copy it into a memfd for every container instead of sealing it (agentrun doctor's binary seal): put it elsewhere (/var/tmp, say)", bin, dir, work)
	}
	return nil
}

// installCopy copies bin, and the agentrun-seccomp beside it if there is
// one, into a directory of their own under work, with plain writes, and
// returns the copy's path.
func installCopy(bin, work string) (string, error) {
	dir, err := os.MkdirTemp(work, "bin-")
	if err != nil {
		return "", err
	}
	for _, name := range []string{filepath.Base(bin), "agentrun-seccomp"} {
		src := filepath.Join(filepath.Dir(bin), name)
		if _, err := os.Stat(src); err != nil && name != filepath.Base(bin) {
			continue
		}
		if err := copyPlain(src, filepath.Join(dir, name)); err != nil {
			return "", err
		}
	}
	return filepath.Join(dir, filepath.Base(bin)), nil
}

// copyPlain copies src to dst, executable, with read and write calls
// (no copy_file_range, which may share the source's pages).
func copyPlain(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(struct{ io.Writer }{out}, struct{ io.Reader }{in}); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// inTurn is xs in order on even turns and reversed on odd ones. A run
// leaves deferred work to the kernel's workers (its namespaces' and
// cgroups' teardown) that runs into the next one: in a fixed order, each
// contender would pay for the one before it, every time, and the first
// for none. Two serves of one build, the same spaced print(45) 100 to
// 150 times interleaved, measured 7 ms apart in one order and 3 ms apart
// the other way in the other.
func inTurn[T any](xs []T, turn int) []T {
	if turn%2 == 0 {
		return xs
	}
	r := slices.Clone(xs)
	slices.Reverse(r)
	return r
}

// measure runs each contender once to warm up (the page cache, the first
// cgroup) and to check that it can run, then n times, interleaved, the
// order reversed every other time (inTurn).
func measure(cs []*contender) {
	for _, c := range cs {
		if c.err != "" {
			log.Printf("%s: not measured: %s", c.name, c.err)
			continue
		}
		if err := runOnce(c, 0, false); err != nil {
			c.err = err.Error()
			log.Printf("%s: not measured: %v", c.name, err)
		}
	}
	for i := range *n {
		for _, c := range inTurn(cs, i) {
			if c.err == "" {
				if err := runOnce(c, i+1, true); err != nil {
					c.err = err.Error()
				}
			}
		}
	}
}

// coldReport measures the floor, the kernel floor, both runc CLIs and a
// cold agentrun run alone (-cold-only), interleaved, and prints their
// medians and CPU per run, agentrun's ratio to the kernel floor and to each
// runc, and its gap to the kernel floor.
func coldReport(w io.Writer, all []*contender) {
	var cs []*contender
	for _, c := range all {
		if c.name == "bare chroot python3" || c.name == floorName || c.name == runcName || c.name == runcLCName || c.name == coldName || c.name == baseColdName {
			cs = append(cs, c)
		}
	}
	measure(cs)
	fmt.Fprintf(w, "%d runs each, interleaved, the order reversed every other time; CPU: user+sys per run of the command and the processes it waited for, median:\n\n| contender | median | p90 | × bare | CPU/run |\n|---|---|---|---|---|\n", *n)
	byName := map[string]time.Duration{}
	bare := find(cs, "bare chroot python3")
	for _, c := range cs {
		if c.err != "" {
			fmt.Fprintf(w, "| %s | not measured: %s | | | |\n", c.name, c.err)
			continue
		}
		byName[c.name] = median(c.times)
		xBare := "–"
		if bare.err == "" && len(bare.times) > 0 {
			xBare = fmt.Sprintf("%.2f×", float64(median(c.times))/float64(median(bare.times)))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", c.name, ms(median(c.times)), ms(pct(c.times, 0.9)), xBare, cpuPerRun(c))
	}
	if cold, ok := byName[coldName]; ok {
		for _, r := range []string{floorName, runcName, runcLCName, baseColdName} {
			if d, ok := byName[r]; ok {
				fmt.Fprintf(w, "\n%s against %s: %.2f×", coldName, r, float64(cold)/float64(d))
			}
		}
		fmt.Fprintln(w)
		if m, ok := coldAgainstRunc(cs); m != "" {
			verdict := "met"
			if !ok {
				verdict = "not met"
			}
			fmt.Fprintf(w, "\nTarget: cold `agentrun run` ≤ 1.0× %s: %s, %s\n", runcName, m, verdict)
		}
		if f := find(cs, floorName); f.err == "" && len(f.cpu) > 0 {
			c := find(cs, coldName)
			fmt.Fprintf(w, "\n%s above %s: %+.1f ms median, %+.1f ms CPU per run\n", coldName, floorName,
				msf(cold-median(f.times)), msf(median(c.cpu)-median(f.cpu)))
		}
	}
}

// coldAgainstRunc is the cold-run target's measure: a cold `agentrun
// run`'s median wall time against `runc run`'s on the same spec, each
// beside bare python's, and their CPU per run; ok when the ratio is at
// most 1.0. "" when either was not measured.
func coldAgainstRunc(cs []*contender) (string, bool) {
	cold, rc, bare := find(cs, coldName), find(cs, runcName), find(cs, "bare chroot python3")
	if cold.err != "" || rc.err != "" || len(cold.times) == 0 || len(rc.times) == 0 {
		return "", false
	}
	r := float64(median(cold.times)) / float64(median(rc.times))
	m := fmt.Sprintf("%.2f× (%s against %s", r, ms(median(cold.times)), ms(median(rc.times)))
	if bare.err == "" && len(bare.times) > 0 {
		b := float64(median(bare.times))
		m += fmt.Sprintf("; %.2f× and %.2f× bare", float64(median(cold.times))/b, float64(median(rc.times))/b)
	}
	m += fmt.Sprintf("; CPU/run %s against %s", cpuPerRun(cold), cpuPerRun(rc))
	if len(cold.cpu) > 0 && len(rc.cpu) > 0 {
		m += fmt.Sprintf(", %.2f×", float64(median(cold.cpu))/float64(median(rc.cpu)))
	}
	return m + ")", r <= 1
}

// baselineCgroupParent is the baseline's cgroup parent, the bench's own:
// removed at its end, where the binary measured keeps its runtime's.
const baselineCgroupParent = "/agentrun-bench-baseline"

// baselineColdContender is the cold run on -baseline's binary, with a
// state dir of its own (its caches are its own to make).
func baselineColdContender(work, rootfs, task string) *contender {
	cfg := filepath.Join(work, "baseline-config.json")
	// A cgroup parent of its own too: a build that removes its runtime's
	// shared parent after each run would otherwise remove the one the
	// binary measured keeps.
	write(cfg, fmt.Sprintf(`{"image":"dir:%s","audit":"","state_dir":%q,"cgroup_parent":%q}`, rootfs, filepath.Join(work, "state-baseline"), baselineCgroupParent))
	return &contender{name: baseColdName, note: "the cold run on -baseline's binary (" + filepath.Base(*baseline) + "), a state dir and cgroup parent of its own",
		cmd: func(int) *exec.Cmd { return exec.Command(*baseline, "run", "--config", cfg, task) }}
}

// msf is d in milliseconds.
func msf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// runcLCContender is runc's CLI at the libcontainer version agentrun
// links (-runc-libcontainer), on the same bundle as Debian's runc: the
// same spec through the same libcontainer, so that what agentrun adds
// around libcontainer is what differs.
func runcLCContender(work, bundle string) *contender {
	c := &contender{name: runcLCName}
	if *runcLC == "" {
		c.err = "no -runc-libcontainer binary (test/runc.sh builds it)"
		return c
	}
	c.note = "runc " + version(*runcLC, "--version") + " built from source (test/runc.sh): the libcontainer agentrun links, the same spec"
	c.cmd = func(i int) *exec.Cmd {
		return exec.Command(*runcLC, "--root", filepath.Join(work, "runc-lc-state"), "run", "--bundle", bundle, fmt.Sprintf("bench-lc-%d", i))
	}
	return c
}

// sessionContender is the cold run's task in a kept session (a 256m ext4
// disk in a store under work): the cold run plus the session's lock, loop
// device, mount and unmount. A kept workspace never comes from the pool.
func sessionContender(work, rootfs string) *contender {
	c := &contender{name: "agentrun run (kept session)", note: "the cold run with keep_workspace: session lock, loop device, ext4 mount, unmount before the answer"}
	cfg := filepath.Join(work, "session-config.json")
	write(cfg, fmt.Sprintf(`{"image":"dir:%s","audit":"","state_dir":%q,"store_dir":%q}`, rootfs, filepath.Join(work, "state"), filepath.Join(work, "store")))
	out, err := exec.Command(*bin, "sessions", "--config", cfg, "new").CombinedOutput()
	if err != nil {
		c.err = fmt.Sprintf("sessions new: %v: %s", err, firstLine(string(out)))
		return c
	}
	task := filepath.Join(work, "session.json")
	write(task, fmt.Sprintf(`{"code":"print(45)","session":%q,"keep_workspace":true}`, strings.TrimSpace(string(out))))
	c.cmd = func(int) *exec.Cmd { return exec.Command(*bin, "run", "--config", cfg, task) }
	return c
}

// keptSection starts the part of the report that other measurements wrote
// (test/bench/initcost.sh): kept as it is when the report is written again.
const keptSection = "\n## Metrics and container init\n"

// keptSections is that part of the report at path, or "".
func keptSections(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if i := strings.Index(string(b), keptSection); i >= 0 {
		return string(b[i:])
	}
	return ""
}

// netBench is the proxy's throughput against a direct loopback transfer.
type netBench struct {
	via, direct float64 // MiB/s
	err         error
}

// pullBench times a first pull and unpack of the python test image from a
// registry on loopback (Debian's docker-registry, started here): agentrun
// pull into an empty store against skopeo copy + umoci unpack, interleaved.
func pullBench(work, layout string) []*contender {
	const runs = 3
	port, stop, err := startRegistry(work)
	if err != nil {
		return []*contender{{name: "first pull + unpack", err: err.Error()}}
	}
	defer stop()
	ref := fmt.Sprintf("127.0.0.1:%d/bench/python:latest", port)
	if out, err := exec.Command("skopeo", "copy", "--dest-tls-verify=false", "oci:"+layout+":latest", "docker://"+ref).CombinedOutput(); err != nil {
		return []*contender{{name: "first pull + unpack", err: fmt.Sprintf("pushing the image: %v %s", err, firstLine(string(out)))}}
	}
	ar := &contender{name: "agentrun pull (first pull + unpack)", note: "content-addressed store, every layer verified, os.Root unpacker"}
	sk := &contender{name: "skopeo copy + umoci unpack", note: "skopeo " + version("skopeo", "--version") + ", umoci " + version("umoci", "--version")}
	for i := range runs {
		dir := filepath.Join(work, fmt.Sprintf("pull-%d", i))
		ar.cmd = func(int) *exec.Cmd {
			return exec.Command(*bin, "pull", "--store", filepath.Join(dir, "store"), ref)
		}
		sk.cmd = func(int) *exec.Cmd {
			return exec.Command("sh", "-c", `skopeo copy --src-tls-verify=false "docker://$1" "oci:$2/layout:latest" >/dev/null && umoci unpack --image "$2/layout:latest" "$2/bundle" && echo 45`,
				"sh", ref, dir)
		}
		for _, c := range []*contender{ar, sk} {
			if c.err != "" {
				continue
			}
			os.RemoveAll(dir)
			os.MkdirAll(dir, 0o700)
			start := time.Now()
			out, err := c.cmd(i).CombinedOutput()
			if err != nil {
				c.err = fmt.Sprintf("%v: %s", err, firstLine(string(out)))
				continue
			}
			c.times = append(c.times, time.Since(start))
		}
		os.RemoveAll(dir)
	}
	return []*contender{ar, sk}
}

// startRegistry runs docker-registry on a free loopback port with its
// storage in work, and returns the port and how to stop it.
func startRegistry(work string) (int, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir := filepath.Join(work, "registry")
	cfg := filepath.Join(work, "registry.yml")
	write(cfg, fmt.Sprintf("version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: 127.0.0.1:%d\n", dir, port))
	cmd := exec.Command("docker-registry", "serve", cfg)
	cmd.Env = []string{}
	if err := cmd.Start(); err != nil {
		return 0, nil, fmt.Errorf("starting docker-registry (test/deps.sh installs it): %w", err)
	}
	stop := func() { cmd.Process.Kill(); cmd.Wait() }
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			c.Close()
			return port, stop, nil
		}
	}
	stop()
	return 0, nil, fmt.Errorf("docker-registry did not listen on %d", port)
}

func runOnce(c *contender, i int, record bool) error {
	if c.call != nil {
		el, stdout, err := c.call(i)
		if err != nil {
			return err
		}
		if want := expected(c); stdout != want {
			return fmt.Errorf("unexpected output %q", firstLine(stdout))
		}
		if record {
			c.times = append(c.times, el)
		}
		return nil
	}
	cmd := c.cmd(i)
	var stdout strings.Builder
	cmd.Stdout = &stdout
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cpu0 := childrenCPU()
	start := time.Now()
	err := cmd.Run()
	el := time.Since(start)
	cpu := childrenCPU() - cpu0
	if err != nil {
		return fmt.Errorf("%v: %s", err, firstLine(stderr.String()+stdout.String()))
	}
	if c.quiet && stdout.Len() > 0 || !c.quiet && !strings.Contains(stdout.String(), "45") {
		return fmt.Errorf("unexpected output %q", firstLine(stdout.String()))
	}
	if strings.HasPrefix(strings.TrimSpace(stdout.String()), "{") {
		var r struct{ Error string }
		if json.Unmarshal([]byte(stdout.String()), &r) == nil && r.Error != "" {
			return fmt.Errorf("%s", r.Error)
		}
	}
	if record {
		c.times = append(c.times, el)
		c.cpu = append(c.cpu, cpu)
	}
	return nil
}

// expected is the stdout a call of c must return.
func expected(c *contender) string {
	if c.quiet {
		return ""
	}
	return "45\n"
}

// cpuPerRun is the median CPU per run of c, or "–" for a call, whose
// work is done by another process (serve, mcp).
func cpuPerRun(c *contender) string {
	if len(c.cpu) == 0 {
		return "–"
	}
	return ms(median(c.cpu))
}

// peakRSS runs cmd once under GNU time and returns the peak RSS (KiB) of
// the process it starts (and of its waited-for children). The command's
// own rusage cannot say: a child that Go starts shares this process's
// memory until it execs, and the kernel counts that as the child's peak.
func peakRSS(cmd *exec.Cmd) (int64, error) {
	timed := exec.Command("/usr/bin/time", append([]string{"-f", "%M", "--", cmd.Path}, cmd.Args[1:]...)...)
	var stderr strings.Builder
	timed.Stderr = &stderr
	if err := timed.Run(); err != nil {
		return 0, fmt.Errorf("%v: %s", err, firstLine(stderr.String()))
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	return strconv.ParseInt(lines[len(lines)-1], 10, 64)
}

// find is the contender named name.
func find(cs []*contender, name string) *contender {
	for _, c := range cs {
		if c.name == name {
			return c
		}
	}
	return &contender{err: "absent"}
}

// targets reports where the run stands against each target of the issue
// that asked for this bench.
func targets(w io.Writer, cs []*contender, floor time.Duration) {
	fmt.Fprintf(w, "\nWhere this run stands against the targets (medians of this run):\n\n| target | measured | met |\n|---|---|---|\n")
	row := func(target string, c *contender, measured func() (string, bool)) {
		if c.err != "" || len(c.times) == 0 {
			fmt.Fprintf(w, "| %s | not measured | – |\n", target)
			return
		}
		m, ok := measured()
		fmt.Fprintf(w, "| %s | %s | %s |\n", target, m, map[bool]string{true: "yes", false: "no"}[ok])
	}
	ratio := func(c *contender, max float64) func() (string, bool) {
		return func() (string, bool) {
			r := float64(median(c.times)) / float64(floor)
			return fmt.Sprintf("%.2f×", r), r <= max
		}
	}
	cold, allow, warm := find(cs, coldName), find(cs, allowName), find(cs, warmName)
	row("cold `agentrun run` ≤ 2.0× the floor", cold, ratio(cold, 2.0))
	if m, ok := coldAgainstRunc(cs); m != "" {
		fmt.Fprintf(w, "| cold `agentrun run` ≤ 1.0× %s (wall, median) | %s | %s |\n", runcName, m, map[bool]string{true: "yes", false: "no"}[ok])
	} else {
		fmt.Fprintf(w, "| cold `agentrun run` ≤ 1.0× %s (wall, median) | not measured | – |\n", runcName)
	}
	if rc := find(cs, runcLCName); rc.err != "" || cold.err != "" {
		fmt.Fprintf(w, "| cold `agentrun run` ≤ %s | not measured | – |\n", runcLCName)
	} else {
		row("cold `agentrun run` ≤ "+runcLCName, cold, func() (string, bool) {
			r := float64(median(cold.times)) / float64(median(rc.times))
			return fmt.Sprintf("%.2f× (%s against %s)", r, ms(median(cold.times)), ms(median(rc.times))), r <= 1
		})
	}
	if base := find(cs, baseColdName); base.err == "" && cold.err == "" && len(base.times) > 0 {
		fmt.Fprintf(w, "| (no target) cold `agentrun run` against -baseline's | %.2f× (%s against %s; CPU/run %s against %s) | – |\n",
			float64(median(cold.times))/float64(median(base.times)), ms(median(cold.times)), ms(median(base.times)), cpuPerRun(cold), cpuPerRun(base))
	}
	row("warm pool ≤ 1.2× the floor", warm, ratio(warm, 1.2))
	if cold.err == "" {
		row("allowlist run ≤ 10 ms above a run without network", allow, func() (string, bool) {
			d := median(allow.times) - median(cold.times)
			return fmt.Sprintf("%+.1f ms", float64(d.Microseconds())/1000), d <= 10*time.Millisecond
		})
		row("peak RSS of one `agentrun run` < 40 MiB", cold, func() (string, bool) {
			return fmt.Sprintf("%.1f MiB", float64(cold.rss)/1024), cold.rssErr == nil && cold.rss > 0 && cold.rss < 40<<10
		})
	}
}

func report(w io.Writer, cs []*contender, load []*loadSubject, pulls []*contender, nb netBench, gobench []string) {
	floor := median(cs[0].times)
	fmt.Fprintf(w, "# agentrun benchmark\n\n")
	fmt.Fprintf(w, "`make bench` on %s. The same `print(45)` task on the python test image, %d runs per contender, interleaved, the order reversed every other time; wall time of the whole command.\n\n", machine(), *n)
	fmt.Fprintln(w, "| contender | median | p90 | max | median / floor | CPU/run | peak RSS | note |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	for _, c := range cs {
		if c.err != "" {
			fmt.Fprintf(w, "| %s | – | – | – | – | – | – | not measured: %s |\n", c.name, strings.ReplaceAll(firstLine(c.err), "|", "/"))
			continue
		}
		rss := "–"
		if c.rssErr == nil && c.rss > 0 {
			rss = fmt.Sprintf("%.1f MiB", float64(c.rss)/1024)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %.2f× | %s | %s | %s |\n", c.name, ms(median(c.times)), ms(pct(c.times, 0.9)),
			ms(slices.Max(c.times)), float64(median(c.times))/float64(floor), cpuPerRun(c), rss, c.note)
	}
	mcpLine(w, cs)
	fmt.Fprintf(w, "\nCPU/run: user+sys of the command and of the processes it waited for, down the tree (getrusage RUSAGE_CHILDREN before and after each run), median; none for the calls to serve or mcp, whose work is the server's (see the load section).\n")
	fmt.Fprintf(w, "\nPeak RSS: GNU time's maximum resident set of the command and the children it waited for (one extra run); for serve, the server process's own VmHWM after the runs above.\n")
	if nb.err != nil {
		fmt.Fprintf(w, "\nProxy throughput: not measured: %v\n", nb.err)
	} else {
		fmt.Fprintf(w, "\nEgress throughput, %d MiB downloaded (median of 3): through a run's proxy (sandbox namespace → CONNECT → host loopback) %.0f MiB/s; straight over loopback %.0f MiB/s (%.2f×).\n",
			proxyBytes>>20, nb.via, nb.direct, nb.via/nb.direct)
	}
	if len(pulls) > 0 {
		fmt.Fprintf(w, "\nFirst pull and unpack of the python test image (%s) from a registry on loopback, 3 runs each, interleaved:\n\n| contender | median | max | ratio |\n|---|---|---|---|\n", imageSize())
		base := median(pulls[len(pulls)-1].times)
		for _, c := range pulls {
			if c.err != "" || len(c.times) == 0 {
				fmt.Fprintf(w, "| %s | – | – | not measured: %s |\n", c.name, strings.ReplaceAll(firstLine(c.err), "|", "/"))
				continue
			}
			ratio := "–"
			if base > 0 {
				ratio = fmt.Sprintf("%.2f× (%s)", float64(median(c.times))/float64(base), c.note)
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s |\n", c.name, ms(median(c.times)), ms(slices.Max(c.times)), ratio)
		}
	}
	targets(w, cs, floor)
	if len(gobench) > 0 {
		fmt.Fprintf(w, "\nGo benchmarks of the per-run work in agentrun's own code (`go test -bench`):\n\n```\n%s\n```\n", strings.Join(gobench, "\n"))
	}
	loadReport(w, load)
}

// imageSize is the compressed size of the python test image's layout.
func imageSize() string {
	var n int64
	filepath.Walk(filepath.Join(*images, "python", "oci", "blobs"), func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return fmt.Sprintf("%.0f MiB compressed", float64(n)/(1<<20))
}

func median(d []time.Duration) time.Duration { return pct(d, 0.5) }

func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

func machine() string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				_, cpu, _ = strings.Cut(l, ": ")
				break
			}
		}
	}
	var u syscall.Utsname
	syscall.Uname(&u)
	rel := make([]byte, 0, 65)
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		rel = append(rel, byte(c))
	}
	cg := "cgroup v1 (hybrid)"
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		cg = "cgroup v2"
	}
	return fmt.Sprintf("%d × %s, Linux %s, %s, %s", runtime.NumCPU(), cpu, rel, cg, time.Now().UTC().Format("2006-01-02"))
}

func version(cmd, flag string) string {
	b, err := exec.Command(cmd, flag).Output()
	if err != nil {
		return "?"
	}
	f := strings.Fields(firstLine(string(b)))
	return f[len(f)-1]
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	l, _, _ := strings.Cut(s, "\n")
	return l
}

func write(p, s string) {
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		log.Fatal(err)
	}
}

// runcBundle writes a bundle whose config.json is the spec agentrun runs
// for task (cold, no network): runner.SandboxSpec of its plan, tini as the
// sandbox's pid 1, the image's passwd and group with the sandbox user
// added, bound read-only over the image's, and the code in the workspace.
// What agentrun does outside the spec (the workspace and etc tmpfs, the
// per-run uid) is its own set-up, measured in its time only.
func runcBundle(work, rootfs, task string) (string, error) {
	return runcBundleOf(work, rootfs, task, "bundle", nil)
}

// runcBundleOf is runcBundle in work's directory name, its program argv
// instead of the task's when argv is not nil (the same spec otherwise).
func runcBundleOf(work, rootfs, task, name string, argv []string) (string, error) {
	dir := filepath.Join(work, name)
	ws := filepath.Join(work, "ws")
	etc := filepath.Join(work, "etc")
	for _, d := range []string{dir, ws, etc} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
	}
	cfg := config.Default()
	data, err := os.ReadFile(task)
	if err != nil {
		return "", err
	}
	p, err := agtask.Load(data, cfg)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(ws, p.CodeFile), p.Code, 0o644); err != nil {
		return "", err
	}
	if err := os.Chown(ws, spec.UID, spec.GID); err != nil {
		return "", err
	}
	if argv != nil {
		p.Argv = argv
	}
	opts := runner.SandboxSpec(p, "/agentrun-bench-runc", cfg.Init, ws, p.Limits.WorkspaceSize)
	for _, f := range runner.IdentityEntries(spec.UID) {
		img, err := os.ReadFile(filepath.Join(rootfs, "etc", f.Name))
		if err != nil {
			return "", err
		}
		out := filepath.Join(etc, f.Name)
		if err := os.WriteFile(out, append(img, f.Entry...), 0o644); err != nil {
			return "", err
		}
		opts = append(opts, spec.WithReadonlyFile(out, "/etc/"+f.Name))
	}
	s, err := spec.New(rootfs, opts...)
	if err != nil {
		return "", err
	}
	s.Linux.CgroupsPath = "" // let runc name one per container
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return "", err
	}
	return dir, os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600)
}

// goBenchmarks runs the Go benchmarks of agentrun's per-run code when the
// go command and the module are here (not on a machine without Go).
func goBenchmarks() []string {
	cmd := exec.Command("go", "test", "-tags", "seccomp", "-run", "^$", "-bench", ".", "-benchmem", "./runtime/spec", "./internal/task")
	b, err := cmd.CombinedOutput()
	if err != nil {
		log.Printf("go benchmarks: not run: %v", err)
		return nil
	}
	// What interception adds to a request: a service against a blind
	// tunnel to the same upstream (root: they build namespaces).
	pb, err := exec.Command("go", "test", "-tags", "seccomp", "-run", "^$", "-bench", "ServiceRequest|TunnelRequest", "./proxy").CombinedOutput()
	if err != nil {
		log.Printf("proxy service benchmarks: not run: %v", err)
	}
	b = append(b, pb...)
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "Benchmark") || (strings.HasPrefix(l, "cpu:") && !slices.Contains(lines, l)) {
			lines = append(lines, l)
		}
	}
	return lines
}
