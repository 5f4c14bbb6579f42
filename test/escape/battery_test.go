package escape

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"debug/elf"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/image/imagetest"
	"github.com/agentrun/agentrun/internal/compose"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/runner"
	"github.com/agentrun/agentrun/internal/sandbox"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/test/testenv"
)

// Probe is one line of the probe's report (test/escape/probe).
type Probe struct {
	ID        string `json:"id"`
	Item      int    `json:"item"`
	Name      string `json:"name"`
	Category  string `json:"category"`
	Blocked   bool   `json:"blocked"`
	Errno     string `json:"errno"`
	Detail    string `json:"detail"`
	ControlOK bool   `json:"control_ok"`
	Control   string `json:"control"`
	NotProbed string `json:"not_probed"`
	Info      bool   `json:"info"`
}

// Limits of the probe run.
const (
	runPids    = 64
	runTmpSize = "8m"
)

// minProbes guards against a battery that silently shrank.
const minProbes = 130

// TestEscapeBattery runs the probes under each runtime
// (AGENTRUN_ESCAPE_RUNTIME picks one).
func TestEscapeBattery(t *testing.T) {
	rts := []string{config.RuntimeLibcontainer, config.RuntimeRunsc}
	if rt := os.Getenv("AGENTRUN_ESCAPE_RUNTIME"); rt != "" {
		rts = []string{rt}
	}
	for _, rt := range rts {
		t.Run(rt, func(t *testing.T) { battery(t, rt, false, false, nil, false) })
		// The same probes in a sandbox the pool made ahead.
		t.Run(rt+"-pooled", func(t *testing.T) { battery(t, rt, true, false, nil, false) })
		if rt == config.RuntimeLibcontainer {
			// And in one it made ahead with a network, its proxy bound
			// to the task's allowlist as the run took it.
			t.Run(rt+"-pooled-allowlist", func(t *testing.T) { battery(t, rt, true, false, []string{"example.com"}, false) })
			// And in a warm one: the probe is exec'd by the task's code
			// from the interpreter the pool started ahead.
			t.Run(rt+"-warm", func(t *testing.T) { battery(t, rt, true, true, nil, false) })
		}
		// And as a process exec'd into a live sandbox (spec §17), by
		// libcontainer or by `runsc exec`: everything the battery proves
		// for a run holds for every process of a live sandbox.
		t.Run(rt+"-live", func(t *testing.T) { battery(t, rt, false, false, nil, true) })
		// And in a live sandbox the pool made ahead for one.
		t.Run(rt+"-live-pooled", func(t *testing.T) { battery(t, rt, true, false, nil, true) })
	}
}

// battery runs the probes under runtime rt, in a sandbox taken from a
// pool if pooled (a warm one, on the python image, if warm), with a network
// allowlist if allow is not empty, as a process exec'd into a live
// sandbox of the same task (its holder the sandbox's program) if live.
func battery(t *testing.T, rt string, pooled, warm bool, allow []string, live bool) {
	expect, ok := expectations[rt]
	if !ok {
		t.Fatalf("no expectation table for runtime %q", rt)
	}
	if len(allow) > 0 {
		expect = withAllowlist(expect)
	}

	// The host binary that runs the containers (and is their init) must not
	// change (CVE-2019-5736).
	selfHash := fileHash(t, "/proc/self/exe")

	dir := t.TempDir() // 0700, root's: nothing here is reachable by other users
	probeBin := buildProbe(t, dir)
	base := "busybox"
	if warm {
		base = "python"
	}
	rootfs, suid, fcaps, fcapsNoEff := makeImage(t, dir, base, probeBin)
	imageHash := imagetest.HashTree(t, rootfs)

	// Host-side bait: an abstract unix socket in the host netns and a TCP
	// listener on every host address. Any connection is a failure, whatever
	// the probe reports.
	var abstractConns, tcpConns atomic.Int32
	abstract := "agentrun-escape-" + randHex(8)
	ul, err := net.Listen("unix", "@"+abstract)
	if err != nil {
		t.Fatalf("listening on @%s: %v", abstract, err)
	}
	defer ul.Close()
	go acceptCount(ul, &abstractConns)
	tl, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	go acceptCount(tl, &tcpConns)
	port := tl.Addr().(*net.TCPAddr).Port
	hostname, _ := os.Hostname()

	cfg := testConfig()
	tmpSize, err := config.ParseSize(runTmpSize)
	if err != nil {
		t.Fatal(err)
	}
	// Each flag and its value in one argument: a value may be empty (no
	// host address but loopback, no file capabilities on this filesystem),
	// and a task's command holds no empty argument.
	args := []string{"/probe",
		"-abstract=" + abstract,
		"-hostport=" + strconv.Itoa(port),
		"-hostips=" + strings.Join(hostIPs(), ","),
		"-hosthostname=" + hostname,
		"-hostpaths=" + strings.Join([]string{cfg.StateDir, cfg.StoreDir, "/run/agentrun", "/var/lib/agentrun", "/var/lib/docker", "docker.sock", "containerd.sock"}, ","),
		"-imagepath=" + rootfs,
		"-pids=" + strconv.Itoa(runPids),
		"-tmpsize=" + strconv.FormatInt(tmpSize, 10),
		"-suid=" + suid,
		"-fcaps=" + fcaps,
		"-fcaps-noeff=" + fcapsNoEff,
		"-uid-first=" + strconv.FormatInt(cfg.RunUIDs.First, 10),
		"-uid-count=" + strconv.FormatInt(cfg.RunUIDs.Count, 10),
	}
	fields := map[string]any{
		"session": "escape-battery",
		"image":   "dir:" + rootfs,
		"command": args,
		"runtime": rt,
		"files":   map[string]any{"README": map[string]string{"content": "escape battery workspace\n"}},
		"limits": map[string]any{"timeout": "60s", "output_bytes": 1 << 20, "pids": runPids,
			"tmp_size": runTmpSize, "workspace_size": "16m", "memory": "256m"},
	}
	if len(allow) > 0 {
		fields["network"] = map[string]any{"allow": allow}
	}
	if warm {
		// The probe replaces the warm interpreter, in the same process.
		argv, _ := json.Marshal(args)
		delete(fields, "command")
		fields["language"], fields["code"] = "python", fmt.Sprintf("import os\nos.execv(%q, %s)\n", args[0], argv)
		cfg.Server.Pool = map[string]config.PoolEntry{"dir:" + rootfs: {Count: 1, Warm: &config.Warm{Language: "python", Preload: []string{"json"}}}}
	}
	taskJSON, _ := json.Marshal(fields)
	plan, err := task.Load(taskJSON, cfg)
	if err != nil {
		t.Fatalf("task.Load: %v", err)
	}
	r, err := compose.Runner(cfg, nil)
	if err != nil {
		t.Fatalf("compose.Runner: %v", err)
	}
	var pool *runner.Pool
	if pooled {
		pool = r.NewPool(map[string]int{plan.Image: 1})
		r.UsePool(pool)
		pool.SetWarm(cfg)
		seed := plan
		if live {
			seed = sandbox.HolderPlan(plan)
		}
		if err := pool.Seed(context.Background(), seed); err != nil {
			t.Fatalf("seeding the pool: %v", err)
		}
		for deadline := time.Now().Add(60 * time.Second); pool.Stats().Ready[plan.Image] < 1; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				pool.Close()
				t.Fatalf("the pool made no sandbox: %+v", pool.Stats())
			}
		}
	}
	var res *result.Result
	if live {
		res = liveRun(t, r, plan)
	} else {
		res = r.Run(context.Background(), plan, runapi.Hooks{})
	}
	if pooled {
		if st := pool.Stats(); st.Hits != 1 || warm && st.Warm[plan.Image] != runapi.WarmOK {
			t.Errorf("the probes did not run in a pooled sandbox (warm: %v): %+v", warm, st)
		}
		if err := pool.Close(); err != nil {
			t.Errorf("closing the pool: %v", err)
		}
	}
	if res.Error != "" {
		assertNoLeaks(t)
		t.Fatalf("run failed: %s (stderr %q)", res.Error, res.Stderr)
	}
	if res.ExitCode != 0 || res.TimedOut || res.OOMKilled || res.StdoutTruncated {
		t.Errorf("probe exit %d signal %q timed_out %v oom %v stdout_truncated %v; stderr:\n%s",
			res.ExitCode, res.Signal, res.TimedOut, res.OOMKilled, res.StdoutTruncated, res.Stderr)
	}
	probes, complete := parseReport(res.Stdout)
	if !complete {
		t.Errorf("the report is incomplete (the probe died?); %d probes parsed; stderr:\n%s", len(probes), res.Stderr)
	}
	t.Logf("runtime %s: %d probes in %d ms", rt, len(probes), res.DurationMS)

	// The battery itself.
	seen := map[string]bool{}
	for _, p := range probes {
		if seen[p.ID] {
			t.Errorf("probe %s reported twice", p.ID)
		}
		seen[p.ID] = true
		t.Run(p.ID, func(t *testing.T) { judge(t, p, expect[p.ID]) })
	}
	if len(probes) < minProbes {
		t.Errorf("only %d probes ran; want at least %d", len(probes), minProbes)
	}
	for _, id := range slices.Sorted(maps.Keys(expect)) {
		if !seen[id] {
			t.Errorf("probe %s (in the expectation table) did not run", id)
		}
	}

	// What the host saw.
	if n := abstractConns.Load(); n != 0 {
		t.Errorf("the host's abstract socket @%s accepted %d connections from the sandbox", abstract, n)
	}
	if n := tcpConns.Load(); n != 0 {
		t.Errorf("the host's TCP listener on port %d accepted %d connections from the sandbox", port, n)
	}
	if h := fileHash(t, "/proc/self/exe"); h != selfHash {
		t.Errorf("the host binary /proc/self/exe changed during the run: sha256 %s -> %s", selfHash, h)
	}
	if h := imagetest.HashTree(t, rootfs); h != imageHash {
		t.Error("the image directory changed during the run")
	}
	assertNoLeaks(t)

	if path := os.Getenv("AGENTRUN_ESCAPE_REPORT"); path != "" {
		// One report per runtime: REPORT.md becomes REPORT-<runtime>.md.
		label := rt
		if warm {
			label += "-warm"
		} else if pooled && !live {
			label += "-pooled"
		}
		if len(allow) > 0 {
			label += "-allowlist"
		}
		if live {
			label += "-live"
		}
		if live && pooled {
			label += "-pooled"
		}
		path = strings.TrimSuffix(path, ".md") + "-" + label + ".md"
		if err := os.WriteFile(path, []byte(markdown(rt, probes, expect)), 0o644); err != nil {
			t.Errorf("writing the report: %v", err)
		} else {
			t.Logf("report written to %s", path)
		}
	}
}

// liveRun runs plan's command as a process exec'd into a live sandbox set
// up from plan (internal/sandbox, as serve's does), and returns its
// outcome as a run's result; the sandbox is ended after.
func liveRun(t *testing.T, r *runner.Runner, plan *task.Plan) *result.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res := &result.Result{}
	sb, err := sandbox.Create(ctx, r, plan, "escape", sandbox.Options{Lifetime: 5 * time.Minute})
	if err != nil {
		res.Error = "creating the live sandbox: " + err.Error()
		return res
	}
	defer func() {
		if err := sb.Close(); err != nil {
			t.Errorf("ending the live sandbox: %v", err)
		}
	}()
	p, err := sb.Exec(sandbox.ExecRequest{Command: plan.Argv, Timeout: 60 * time.Second})
	if err != nil {
		res.Error = "exec: " + err.Error()
		return res
	}
	var stdout, stderr strings.Builder
	for seq, done := 0, false; !done; {
		var evs []sandbox.Event
		evs, seq, done = p.Next(ctx, seq)
		if ctx.Err() != nil {
			res.Error = "the probe did not end: " + ctx.Err().Error()
			return res
		}
		for _, ev := range evs {
			data := ev.Data
			if ev.DataB64 != "" {
				b, _ := base64.StdEncoding.DecodeString(ev.DataB64)
				data = string(b)
			}
			switch ev.Event {
			case "stdout":
				stdout.WriteString(data)
			case "stderr":
				stderr.WriteString(data)
			case "exit":
				res.ExitCode, res.Signal, res.TimedOut, res.DurationMS = *ev.ExitCode, ev.Signal, ev.TimedOut, ev.DurationMS
				res.StdoutTruncated = ev.Dropped > 0
			}
		}
	}
	res.Stdout, res.Stderr = stdout.String(), stderr.String()
	return res
}

// judge applies one probe's result and its runtime expectation.
func judge(t *testing.T, p Probe, e expectation) {
	t.Logf("%s: blocked=%v errno=%s detail=%s | control_ok=%v %s", p.Name, p.Blocked, p.Errno, p.Detail, p.ControlOK, p.Control)
	if p.Info || e.Info {
		return
	}
	if p.NotProbed != "" {
		if e.MayNotProbe != "" {
			t.Logf("not probed on this runtime (%s): %s", e.MayNotProbe, p.NotProbed)
			return
		}
		t.Errorf("NOT PROBED: %s", p.NotProbed)
		return
	}
	if !p.ControlOK {
		t.Errorf("positive control failed, so the probe proves nothing: %s", p.Control)
	}
	if !p.Blocked {
		t.Errorf("NOT BLOCKED (item %d, %s): %s: %s", p.Item, p.Name, p.Errno, p.Detail)
		return
	}
	if e.Exact && !slices.Contains(e.Errnos, p.Errno) {
		t.Errorf("blocked with %q; want one of %v (item %d, %s)", p.Errno, e.Errnos, p.Item, p.Name)
		return
	}
	if len(e.Errnos) > 0 && !slices.Contains(e.Errnos, p.Errno) {
		t.Logf("note: blocked with %q; this runtime is known to give %v", p.Errno, e.Errnos)
	}
}

// parseReport reads {"version":1,"probes":[...]}; if the probe died mid-way
// it falls back to the one-probe-per-line layout and says the report is
// incomplete.
func parseReport(out string) ([]Probe, bool) {
	var rep struct {
		Probes []Probe `json:"probes"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err == nil {
		return rep.Probes, true
	}
	var ps []Probe
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSuffix(strings.TrimSpace(sc.Text()), ",")
		var p Probe
		if strings.HasPrefix(line, `{"id"`) && json.Unmarshal([]byte(line), &p) == nil {
			ps = append(ps, p)
		}
	}
	return ps, false
}

// buildProbe builds the probe statically into dir.
func buildProbe(t *testing.T, dir string) string {
	t.Helper()
	// A prebuilt probe, for hosts without Go (the device run).
	if pre := os.Getenv("AGENTRUN_ESCAPE_PROBE"); pre != "" {
		b, err := os.ReadFile(pre)
		if err != nil {
			t.Fatalf("AGENTRUN_ESCAPE_PROBE: %v", err)
		}
		out := filepath.Join(dir, "probe")
		if err := os.WriteFile(out, b, 0o755); err != nil {
			t.Fatal(err)
		}
		return out
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		// The toolchain that built this test, when go is not on PATH.
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go") //lint:ignore SA1019 the test runs where it was built
	}
	out := filepath.Join(dir, "probe")
	cmd := exec.Command(goBin, "build", "-trimpath", "-o", out, "./test/escape/probe")
	cmd.Dir = testenv.RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GOFLAGS=-buildvcs=false")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the probe: %v\n%s", err, b)
	}
	f, err := elf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("the probe is not static: it has a PT_INTERP")
		}
	}
	return out
}

// makeImage copies test image base into dir/rootfs and adds the probe as
// /probe, a setuid+setgid-root copy as /probe-suid, and copies with every
// file capability permitted, effective (/probe-fcaps) and not
// (/probe-fcaps-noeff); a path is "" when the filesystem refuses the xattr.
func makeImage(t *testing.T, dir, base, probeBin string) (rootfs, suid, fcaps, fcapsNoEff string) {
	t.Helper()
	rootfs = filepath.Join(dir, "rootfs")
	src := filepath.Join(*imagesDir, base, "rootfs")
	if out, err := exec.Command("cp", "-a", src, rootfs).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	install := func(name string, mode os.FileMode) string {
		path := filepath.Join(rootfs, name)
		b, err := os.ReadFile(probeBin)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(path, 0, 0); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		return path
	}
	install("probe", 0o755)
	install("probe-suid", 0o755|os.ModeSetuid|os.ModeSetgid)
	suid = "/probe-suid"
	withCaps := func(name string, effective bool) string {
		p := install(name, 0o755)
		// struct vfs_cap_data, revision 2: every capability permitted.
		var capData [20]byte
		magic := uint32(0x02000000)
		if effective {
			magic |= 0x1 // VFS_CAP_FLAGS_EFFECTIVE
		}
		binary.LittleEndian.PutUint32(capData[0:], magic)
		binary.LittleEndian.PutUint32(capData[4:], 0xffffffff) // permitted, caps 0-31
		binary.LittleEndian.PutUint32(capData[12:], 0x1ff)     // permitted, caps 32-40
		if err := unix.Setxattr(p, "security.capability", capData[:], 0); err != nil {
			t.Logf("cannot set file capabilities on %s: %v; its probe will not run", p, err)
			return ""
		}
		return "/" + name
	}
	fcaps = withCaps("probe-fcaps", true)
	fcapsNoEff = withCaps("probe-fcaps-noeff", false)
	return rootfs, suid, fcaps, fcapsNoEff
}

// hostIPs are the host's non-loopback addresses a sandbox might reach.
func hostIPs() []string {
	addrs, _ := net.InterfaceAddrs()
	var ips []string
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok || n.IP.IsLoopback() || n.IP.IsLinkLocalUnicast() || n.IP.IsMulticast() {
			continue
		}
		ips = append(ips, n.IP.String())
	}
	return ips
}

func acceptCount(l net.Listener, n *atomic.Int32) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		n.Add(1)
		c.Close()
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func fileHash(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// markdown renders the report as a table, by checklist item.
func markdown(rt string, probes []Probe, expect map[string]expectation) string {
	ps := slices.Clone(probes)
	sort.SliceStable(ps, func(i, j int) bool { return ps[i].Item < ps[j].Item })
	cell := func(s string) string {
		s = strings.ReplaceAll(s, "|", `\|`)
		s = strings.ReplaceAll(s, "\n", " ")
		if len(s) > 160 {
			s = s[:160] + "…"
		}
		return s
	}
	var b strings.Builder
	blocked, info, notProbed := 0, 0, 0
	for _, p := range ps {
		switch {
		case p.Info || expect[p.ID].Info:
			info++
		case p.NotProbed != "":
			notProbed++
		case p.Blocked && p.ControlOK:
			blocked++
		}
	}
	fmt.Fprintf(&b, "## Escape-probe battery (runtime %s, %s/%s)\n\n", rt, runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(&b, "%d probes: %d blocked with a working control, %d informational, %d not probed, %d failed.\n\n",
		len(ps), blocked, info, notProbed, len(ps)-blocked-info-notProbed)
	b.WriteString("| item | probe | category | result | errno | control | detail |\n|---|---|---|---|---|---|---|\n")
	for _, p := range ps {
		result := "blocked"
		switch {
		case p.Info || expect[p.ID].Info:
			result = "info: " + map[bool]string{true: "blocked", false: "allowed"}[p.Blocked]
		case p.NotProbed != "":
			result = "not probed"
		case !p.Blocked:
			result = "**NOT BLOCKED**"
		}
		ctl := "ok"
		if !p.ControlOK {
			ctl = "**failed**"
		}
		item := strconv.Itoa(p.Item)
		if p.Item == 0 {
			item = "–"
		}
		detail := p.Detail
		if p.NotProbed != "" {
			detail = p.NotProbed
		}
		fmt.Fprintf(&b, "| %s | `%s` %s | %s | %s | %s | %s | %s |\n", item, p.ID, cell(p.Name), p.Category, result, p.Errno, ctl, cell(detail))
	}
	return b.String()
}
