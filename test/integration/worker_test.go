package integration

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/worker"
)

// natsServer is a nats-server process with JetStream on a temp dir, on
// loopback.
type natsServer struct {
	t           testing.TB
	port, cport int
	dir, name   string
	routes      []string // cluster routes (nats://127.0.0.1:P), nil for a lone server
	extra       []string // more nats-server arguments
	cmd         *exec.Cmd
	log         *os.File
}

// freePort is a TCP port free on loopback right now.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startNATS starts a lone nats-server with JetStream; it fails the test
// (never skips) when nats-server is missing.
func startNATS(t testing.TB, extra ...string) *natsServer {
	t.Helper()
	s := &natsServer{t: t, port: freePort(t), dir: t.TempDir(), name: "n1", extra: extra}
	s.start()
	return s
}

func (s *natsServer) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.port) }

func (s *natsServer) start() {
	s.t.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		s.t.Fatalf("nats-server is missing (Debian package nats-server; test/deps.sh installs it): %v", err)
	}
	args := []string{"-js", "-sd", filepath.Join(s.dir, "js"), "-a", "127.0.0.1", "-p", strconv.Itoa(s.port), "-n", s.name}
	args = append(args, s.extra...)
	if s.routes != nil {
		args = append(args, "--cluster_name", "agentrun-test", "--cluster", fmt.Sprintf("nats://127.0.0.1:%d", s.cport),
			"--routes", strings.Join(s.routes, ","))
	}
	if s.log, err = os.OpenFile(filepath.Join(s.dir, "nats.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err != nil {
		s.t.Fatal(err)
	}
	s.cmd = exec.Command(bin, args...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("starting nats-server: %v", err)
	}
	cmd := s.cmd
	s.t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", s.port)); err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("nats-server did not listen on %d: %s", s.port, s.logText())
		}
	}
}

// stop ends the server with sig and waits for it.
func (s *natsServer) stop(sig syscall.Signal) {
	s.cmd.Process.Signal(sig)
	s.cmd.Wait()
	s.log.Close()
}

func (s *natsServer) logText() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "nats.log"))
	return string(b)
}

// startCluster starts three nats-servers on loopback routed to each other.
func startCluster(t testing.TB) []*natsServer {
	t.Helper()
	var ss []*natsServer
	var routes []string
	for i := range 3 {
		s := &natsServer{t: t, port: freePort(t), cport: freePort(t), dir: t.TempDir(), name: fmt.Sprintf("n%d", i+1)}
		ss = append(ss, s)
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", s.cport))
	}
	for _, s := range ss {
		s.routes = routes
		s.start()
	}
	return ss
}

// bus is the test's own NATS client.
type bus struct {
	t  testing.TB
	nc *nats.Conn
	js jetstream.JetStream
	wc config.Worker
}

func dialBus(t testing.TB, urls ...string) *bus {
	t.Helper()
	wc := config.Default().Worker
	wc.NATS = urls
	return dialWith(t, wc)
}

// dialWith connects to the bus as a worker configured by wc would (its
// creds, its TLS).
func dialWith(t testing.TB, wc config.Worker) *bus {
	t.Helper()
	nc, err := worker.Connect(wc, "agentrun test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &bus{t: t, nc: nc, js: js, wc: wc}
}

// publish puts a task on the bus, retrying while the servers fail over.
func (b *bus) publish(id, taskJSON string) (duplicate bool) {
	b.t.Helper()
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		duplicate, err = worker.Publish(ctx, b.js, b.wc, id, []byte(taskJSON))
		cancel()
		if err == nil {
			return duplicate
		}
	}
	b.t.Fatalf("publishing %s: %v", id, err)
	return false
}

// try calls f until it succeeds, for up to 30s: the servers may be
// failing over.
func (b *bus) try(what string, f func(ctx context.Context) error) {
	b.t.Helper()
	var err error
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = f(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("%s: %v", what, err)
		}
	}
}

// kv opens the results bucket.
func (b *bus) kv() (kv jetstream.KeyValue) {
	b.t.Helper()
	b.try("opening the results bucket", func(ctx context.Context) (err error) {
		kv, err = worker.OpenBucket(ctx, b.js, b.wc)
		return err
	})
	return kv
}

// results waits for the result of every id, within limit.
func (b *bus) results(ids []string, limit time.Duration) map[string]*result.Result {
	b.t.Helper()
	kv := b.kv()
	out := map[string]*result.Result{}
	deadline := time.Now().Add(limit)
	for _, id := range ids {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			res, err := worker.Get(ctx, kv, id)
			cancel()
			if err == nil {
				out[id] = res
				break
			}
			if time.Now().After(deadline) {
				b.t.Fatalf("no result for %s within %s (%d of %d came): %v", id, limit, len(out), len(ids), err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return out
}

// stored is how many values were ever written to the results bucket: one
// per task when every result was stored once.
func (b *bus) stored() (n uint64) {
	b.t.Helper()
	b.try("results bucket info", func(ctx context.Context) error {
		st, err := b.js.Stream(ctx, "KV_"+b.wc.Results)
		if err == nil {
			n = st.CachedInfo().State.LastSeq
		}
		return err
	})
	return n
}

// consumer is the shared consumer's state.
func (b *bus) consumer() (ci *jetstream.ConsumerInfo) {
	b.t.Helper()
	b.try("consumer info", func(ctx context.Context) error {
		c, err := b.js.Consumer(ctx, b.wc.Stream, worker.Consumer)
		if err == nil {
			ci = c.CachedInfo()
		}
		return err
	})
	return ci
}

// workerProc is an `agentrun worker` process on the suite's state dir.
type workerProc struct {
	t      testing.TB
	cmd    *exec.Cmd
	audit  string
	mu     sync.Mutex
	stderr strings.Builder
}

// startWorker starts agentrun worker on the busybox image with the
// worker section over (nats, slots, ...), and waits until it takes tasks.
func startWorker(t testing.TB, over map[string]any) *workerProc {
	t.Helper()
	return startWorkerCfg(t, over, nil)
}

// startWorkerCfg is startWorker with more top-level config keys.
func startWorkerCfg(t testing.TB, over, top map[string]any) *workerProc {
	t.Helper()
	dir := t.TempDir()
	wc := map[string]any{"ack_wait": "2s", "retry_delay": "100ms"}
	for k, v := range over {
		wc[k] = v
	}
	cfg := map[string]any{"image": busyboxImage, "state_dir": stateDir, "store_dir": filepath.Join(stateDir, "store"),
		"audit": filepath.Join(dir, "audit.jsonl"), "worker": wc,
		"policy": map[string]any{"local_images": []string{*imagesDir, os.TempDir()}}}
	for k, v := range top {
		cfg[k] = v
	}
	w := &workerProc{t: t, audit: filepath.Join(dir, "audit.jsonl")}
	w.cmd = exec.Command(agentrunBin(t), "worker", "--config", writeConfig(t, cfg))
	pr, err := w.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if w.cmd.ProcessState != nil {
			return
		}
		w.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { w.cmd.Wait(); close(done) }()
		select {
		case <-done:
			return
		case <-time.After(30 * time.Second):
		}
		w.cmd.Process.Kill()
		<-done
		if err := gcCLI(t); err != nil {
			t.Errorf("after killing the worker: %v", err)
		}
	})
	ready := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(pr)
		once := sync.Once{}
		for sc.Scan() {
			w.mu.Lock()
			w.stderr.WriteString(sc.Text() + "\n")
			w.mu.Unlock()
			if strings.Contains(sc.Text(), "taking tasks") {
				once.Do(func() { close(ready) })
			}
		}
	}()
	select {
	case <-ready:
	case <-exited:
		t.Fatalf("agentrun worker exited: %s", w.log())
	case <-time.After(30 * time.Second):
		t.Fatalf("agentrun worker did not start: %s", w.log())
	}
	return w
}

func (w *workerProc) log() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stderr.String()
}

// stop sends SIGTERM and waits for a clean exit.
func (w *workerProc) stop() {
	w.t.Helper()
	w.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- w.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			w.t.Fatalf("agentrun worker exited with %v: %s", err, w.log())
		}
	case <-time.After(60 * time.Second):
		w.t.Fatalf("agentrun worker did not stop on SIGTERM: %s", w.log())
	}
}

// runs counts the worker's audit records per task hash.
func (w *workerProc) runs() map[string]int {
	w.t.Helper()
	n := map[string]int{}
	f, err := os.Open(w.audit)
	if os.IsNotExist(err) {
		return n
	}
	if err != nil {
		w.t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec struct {
			TaskHash string `json:"task_hash"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			w.t.Fatalf("audit line: %v", err)
		}
		n[rec.TaskHash]++
	}
	return n
}

func taskHash(taskJSON string) string {
	sum := sha256.Sum256([]byte(taskJSON))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// cgroupSampler counts, every few milliseconds, the run cgroups whose
// processes are children of each worker process: how many sandboxes each
// worker has at once, seen from the cgroups.
type cgroupSampler struct {
	mu   sync.Mutex
	max  map[int]int             // worker pid -> most sandboxes at once
	seen map[int]map[string]bool // worker pid -> run ids seen
	stop chan struct{}
	done chan struct{}
}

func sampleCgroups() *cgroupSampler {
	s := &cgroupSampler{max: map[int]int{}, seen: map[int]map[string]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
	parent := filepath.Dir(hostCgroupOf("x"))
	go func() {
		defer close(s.done)
		for {
			select {
			case <-s.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			now := map[int]int{}
			entries, _ := os.ReadDir(parent)
			for _, e := range entries {
				if !e.IsDir() {
					continue
				}
				procs, _ := os.ReadFile(filepath.Join(parent, e.Name(), "cgroup.procs"))
				for _, f := range strings.Fields(string(procs)) {
					if ppid := parentOf(f); ppid > 0 {
						now[ppid]++
						s.mu.Lock()
						if s.seen[ppid] == nil {
							s.seen[ppid] = map[string]bool{}
						}
						s.seen[ppid][e.Name()] = true
						s.mu.Unlock()
						break
					}
				}
			}
			s.mu.Lock()
			for pid, n := range now {
				s.max[pid] = max(s.max[pid], n)
			}
			s.mu.Unlock()
		}
	}()
	return s
}

// parentOf is the parent pid of pid (0 when it is gone).
func parentOf(pid string) int {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "PPid:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

func (s *cgroupSampler) end() {
	close(s.stop)
	<-s.done
}

func (s *cgroupSampler) most(pid int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.max[pid]
}

func (s *cgroupSampler) runsOf(pid int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for id := range s.seen[pid] {
		ids = append(ids, id)
	}
	return ids
}

// echoTask is a busybox task printing its own id.
func echoTask(id string) string {
	return fmt.Sprintf(`{"id":%q,"command":["echo",%q]}`, id, "out "+id)
}

// comparable is res without what differs between two runs of one task.
func comparable(res *result.Result) result.Result {
	c := *res
	c.ID, c.DurationMS, c.CPUMS, c.MemoryPeakBytes = "", 0, 0, 0
	return c
}

// TestWorkerTwoWorkers200Tasks: 200 tasks over two workers each get
// exactly one result, stored once, with the fields of a local run of the
// same task; each task ran once; both workers took part; neither ever had
// more sandboxes than its slots (seen from the cgroups).
func TestWorkerTwoWorkers200Tasks(t *testing.T) {
	ns := startNATS(t)
	const slots = 3
	w1 := startWorker(t, map[string]any{"nats": []string{ns.url()}, "slots": slots})
	w2 := startWorker(t, map[string]any{"nats": []string{ns.url()}, "slots": slots})
	b := dialBus(t, ns.url())
	cg := sampleCgroups()
	var ids []string
	tasks := map[string]string{}
	for i := range 200 {
		id := fmt.Sprintf("many-%03d", i)
		ids = append(ids, id)
		tasks[id] = echoTask(id)
		if b.publish(id, tasks[id]) {
			t.Fatalf("%s: reported as a duplicate", id)
		}
	}
	got := b.results(ids, 50*time.Second)
	cg.end()

	cfg := testConfig(t)
	cfg.Image = busyboxImage
	local := comparable(runOnly(t, cfg, nil, tasks[ids[0]]))
	if local.Stdout != "out many-000\n" || local.Error != "" {
		t.Fatalf("local run: %+v", local)
	}
	for _, id := range ids {
		want := local
		want.Stdout, want.StdoutBytes = "out "+id+"\n", int64(len("out "+id+"\n"))
		if c := comparable(got[id]); fmt.Sprint(c) != fmt.Sprint(want) {
			t.Errorf("%s: result %+v\nwant (a local run's) %+v", id, c, want)
		}
	}
	if n := b.stored(); n != 200 {
		t.Errorf("results bucket got %d writes, want 200 (one per task)", n)
	}
	r1, r2 := w1.runs(), w2.runs()
	for _, id := range ids {
		if n := r1[taskHash(tasks[id])] + r2[taskHash(tasks[id])]; n != 1 {
			t.Errorf("%s ran %d times", id, n)
		}
	}
	if len(r1) == 0 || len(r2) == 0 {
		t.Errorf("one worker took every task: %d and %d", len(r1), len(r2))
	}
	for _, w := range []*workerProc{w1, w2} {
		pid := w.cmd.Process.Pid
		if m := cg.most(pid); m > slots || m == 0 {
			t.Errorf("worker %d had at most %d sandboxes at once (cgroups), want 1..%d", pid, m, slots)
		}
		t.Logf("worker %d: %d runs, at most %d at once", pid, len(w.runs()), cg.most(pid))
	}
	w1.stop()
	w2.stop()
	assertNoLeaks(t)
}

// TestWorkerSlotsBoundSandboxes: a worker with 2 slots and 6 tasks of one
// second never has more than 2 sandboxes at once, and has 2.
func TestWorkerSlotsBoundSandboxes(t *testing.T) {
	ns := startNATS(t)
	w := startWorker(t, map[string]any{"nats": []string{ns.url()}, "slots": 2})
	b := dialBus(t, ns.url())
	cg := sampleCgroups()
	var ids []string
	for i := range 6 {
		id := fmt.Sprintf("slow-%d", i)
		ids = append(ids, id)
		b.publish(id, fmt.Sprintf(`{"id":%q,"command":["sleep","1"]}`, id))
	}
	for id, res := range b.results(ids, 30*time.Second) {
		if res.Error != "" || res.ExitCode != 0 {
			t.Errorf("%s: %+v", id, res)
		}
	}
	cg.end()
	if m := cg.most(w.cmd.Process.Pid); m != 2 {
		t.Errorf("at most %d sandboxes at once (cgroups), want exactly the 2 slots", m)
	}
	w.stop()
	assertNoLeaks(t)
}

// TestWorkerDeliverySemantics: a task published twice with one id runs
// once; a task whose result is already stored is acked without running;
// a task failing on the host ends after max_deliver with an error result
// naming the deliveries; a policy refusal and a kept session that does
// not exist are the result at once and are never delivered again; none
// of these has exit_code 0; and submit and result print results with
// run's exit codes.
func TestWorkerDeliverySemantics(t *testing.T) {
	ns := startNATS(t)
	w := startWorker(t, map[string]any{"nats": []string{ns.url()}, "slots": 2, "max_deliver": 3})
	b := dialBus(t, ns.url())
	kv := b.kv()

	// The same id twice: the stream drops the second.
	dup := `{"id":"dup-1","command":["echo","once"]}`
	if b.publish("dup-1", dup) {
		t.Fatal("first publish reported as a duplicate")
	}
	if !b.publish("dup-1", dup) {
		t.Error("second publish of dup-1 was not dropped as a duplicate")
	}
	// A result already stored (a worker that stored it and died before
	// its ack): the delivery is acked, nothing runs.
	planted, _ := json.Marshal(&result.Result{Stdout: "planted\n"})
	if _, err := kv.Create(context.Background(), "pre-1", planted); err != nil {
		t.Fatal(err)
	}
	pre := `{"id":"pre-1","command":["echo","ran"]}`
	b.publish("pre-1", pre)
	// A host failure on every delivery: the image is not there.
	poison := fmt.Sprintf(`{"id":"poison-1","image":"dir:%s","command":["true"]}`, filepath.Join(t.TempDir(), "missing"))
	b.publish("poison-1", poison)

	got := b.results([]string{"dup-1", "pre-1", "poison-1"}, 30*time.Second)
	if got["dup-1"].Stdout != "once\n" {
		t.Errorf("dup-1: %+v", got["dup-1"])
	}
	if !strings.Contains(got["poison-1"].Error, "each of 3 deliveries") {
		t.Errorf("poison-1: error %q, want one naming the 3 deliveries", got["poison-1"].Error)
	}
	// Wait until the pre-1 delivery is acked: nothing pending.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if ci := b.consumer(); ci.NumPending == 0 && ci.NumAckPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("deliveries still pending: %+v", b.consumer())
		}
	}
	if res, _ := worker.Get(context.Background(), kv, "pre-1"); res == nil || res.Stdout != "planted\n" {
		t.Errorf("pre-1: %+v, want the planted result", res)
	}
	runs := w.runs()
	for _, c := range []struct {
		name, task string
		want       int
	}{{"dup-1", dup, 1}, {"pre-1", pre, 0}, {"poison-1", poison, 3}} {
		if n := runs[taskHash(c.task)]; n != c.want {
			t.Errorf("%s ran %d times, want %d", c.name, n, c.want)
		}
	}

	// A refusal: the result at once, delivered once, never run.
	before := b.consumer().Delivered.Consumer
	refused := `{"id":"refused-1","command":["true"],"limits":{"memory":"100g"}}`
	b.publish("refused-1", refused)
	res := b.results([]string{"refused-1"}, 10*time.Second)["refused-1"]
	if !strings.Contains(res.Error, "limits.memory") || !strings.Contains(res.Error, "exceeds policy") {
		t.Errorf("refused-1: error %q", res.Error)
	}
	time.Sleep(500 * time.Millisecond) // five retry delays
	if d := b.consumer().Delivered.Consumer - before; d != 1 {
		t.Errorf("refused-1 delivered %d times, want 1", d)
	}
	if n := w.runs()[taskHash(refused)]; n != 0 {
		t.Errorf("refused-1 ran %d times", n)
	}
	// Neither run, and exit_code says so as submit's exit status does.
	for name, res := range map[string]*result.Result{"refused-1": res, "poison-1": got["poison-1"]} {
		if res.ExitCode != result.ExitSetup {
			t.Errorf("%s: exit_code %d, want %d", name, res.ExitCode, result.ExitSetup)
		}
	}

	// keep_workspace on a session that was never made: the task's fault,
	// answered at once, delivered once.
	before = b.consumer().Delivered.Consumer
	nosession := `{"id":"nosession-1","session":"ss-00000000000000000000000000000000","keep_workspace":true,"command":["true"]}`
	b.publish("nosession-1", nosession)
	res = b.results([]string{"nosession-1"}, 10*time.Second)["nosession-1"]
	if !strings.Contains(res.Error, "no such session") || strings.Contains(res.Error, "deliveries") || res.ExitCode != result.ExitSetup {
		t.Errorf("nosession-1: exit_code %d, error %q", res.ExitCode, res.Error)
	}
	time.Sleep(500 * time.Millisecond) // five retry delays
	if d := b.consumer().Delivered.Consumer - before; d != 1 {
		t.Errorf("nosession-1 delivered %d times, want 1", d)
	}

	// The CLI: submit waits and exits as run would; --no-wait prints the
	// id; result fetches it.
	cfg := writeConfig(t, map[string]any{"worker": map[string]any{"nats": []string{ns.url()}}})
	sub := func(stdin string, args ...string) (string, int) {
		cmd := exec.Command(agentrunBin(t), append([]string{"submit", "--config", cfg}, args...)...)
		if args[0] == "result" {
			cmd = exec.Command(agentrunBin(t), append([]string{"result", "--config", cfg}, args[1:]...)...)
		}
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.Output()
		if ee, ok := err.(*exec.ExitError); ok {
			return string(out), ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), 0
	}
	if out, code := sub(`{"command":["sh","-c","echo hi; exit 3"]}`, "-"); code != 3 || !strings.Contains(out, `"stdout": "hi\n"`) {
		t.Errorf("submit: exit %d, %s", code, out)
	}
	if out, code := sub(`{"command":["true"],"limits":{"memory":"100g"}}`, "-"); code != 125 || !strings.Contains(out, "exceeds policy") {
		t.Errorf("submit of a refused task: exit %d, %s", code, out)
	}
	if out, code := sub(`{"command":["x"],"bogus":1}`, "-"); code != 125 || !strings.Contains(out, "bogus") {
		t.Errorf("submit of a bad task: exit %d, %s", code, out)
	}
	out, code := sub(`{"id":"cli-1","command":["echo","later"]}`, "--no-wait", "-")
	if code != 0 || strings.TrimSpace(out) != "cli-1" {
		t.Errorf("submit --no-wait: exit %d, %q", code, out)
	}
	if out, code := sub("", "result", "--wait", "20s", "cli-1"); code != 0 || !strings.Contains(out, `"stdout": "later\n"`) {
		t.Errorf("result cli-1: exit %d, %s", code, out)
	}
	if out, code := sub("", "result", "nope-1"); code != 125 || !strings.Contains(out, "no result") {
		t.Errorf("result of an unknown id: exit %d, %s", code, out)
	}
	w.stop()
	assertNoLeaks(t)
}

// TestWorkerRefusesIncompatibleStream: a stream of the worker's name that
// is not a work queue, or a bucket with another TTL, is not used, and the
// worker says why.
func TestWorkerRefusesIncompatibleStream(t *testing.T) {
	ns := startNATS(t)
	b := dialBus(t, ns.url())
	if _, err := b.js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "AGENTRUN", Subjects: []string{"agentrun.tasks"}}); err != nil {
		t.Fatal(err)
	}
	cfg := map[string]any{"image": busyboxImage, "state_dir": stateDir, "audit": "",
		"worker": map[string]any{"nats": []string{ns.url()}}}
	out, err := exec.Command(agentrunBin(t), "worker", "--config", writeConfig(t, cfg)).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("worker on an incompatible stream: %v: %s", err, out)
	}
	if !strings.Contains(string(out), "stream AGENTRUN exists with incompatible settings: retention is Limits, not WorkQueue") {
		t.Errorf("worker's error: %s", out)
	}

	// A results bucket of the worker's name that keeps results for another
	// time.
	if err := b.js.DeleteStream(context.Background(), "AGENTRUN"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: "agentrun-results", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(agentrunBin(t), "worker", "--config", writeConfig(t, cfg)).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 ||
		!strings.Contains(string(out), "results bucket agentrun-results exists with incompatible settings: ttl 1h0m0s, not worker.result_ttl 24h0m0s") {
		t.Errorf("worker on an incompatible bucket: %v: %s", err, out)
	}
	assertNoLeaks(t)
}

// sleepTasks publishes n tasks that sleep secs and print their id.
func sleepTasks(b *bus, prefix string, n int, secs string) (ids []string, tasks map[string]string) {
	tasks = map[string]string{}
	for i := range n {
		id := fmt.Sprintf("%s-%02d", prefix, i)
		ids = append(ids, id)
		tasks[id] = fmt.Sprintf(`{"id":%q,"command":["sh","-c","sleep %s; echo %s"]}`, id, secs, id)
		b.publish(id, tasks[id])
	}
	return ids, tasks
}

// checkEcho checks that each result is its task's clean exit and that the
// bucket holds exactly one write per task.
func checkEcho(t *testing.T, b *bus, got map[string]*result.Result, want int) {
	t.Helper()
	for id, res := range got {
		if res.Error != "" || res.ExitCode != 0 || res.Stdout != id+"\n" {
			t.Errorf("%s: %+v", id, res)
		}
	}
	if n := b.stored(); n != uint64(want) {
		t.Errorf("results bucket got %d writes, want %d (one per task)", n, want)
	}
}

// TestWorkerSIGKILLRedelivers: a worker killed while it runs tasks loses
// them back to the stream; the other worker completes them, each result
// stored once; agentrun gc then removes every sandbox the killed worker
// left.
func TestWorkerSIGKILLRedelivers(t *testing.T) {
	ns := startNATS(t)
	cg := sampleCgroups()
	defer cg.end()
	victim := startWorker(t, map[string]any{"nats": []string{ns.url()}, "slots": 2})
	b := dialBus(t, ns.url())
	ids, _ := sleepTasks(b, "kill", 8, "1")
	// The victim's sandboxes, seen from the cgroups.
	pid := victim.cmd.Process.Pid
	for deadline := time.Now().Add(15 * time.Second); len(cg.runsOf(pid)) < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the worker ran nothing: %s", victim.log())
		}
	}
	survivor := startWorker(t, map[string]any{"nats": []string{ns.url()}, "slots": 2})
	victim.cmd.Process.Kill()
	victim.cmd.Wait()
	left := cg.runsOf(pid)
	if err := gcCLI(t); err != nil {
		t.Fatal(err)
	}
	for _, id := range left {
		if _, err := os.Stat(hostCgroupOf(id)); err == nil {
			t.Errorf("run %s of the killed worker: cgroup left after gc", id)
		}
		if _, err := os.Stat(filepath.Join(stateDir, "runs", id)); err == nil {
			t.Errorf("run %s of the killed worker: state left after gc", id)
		}
	}
	checkEcho(t, b, b.results(ids, 40*time.Second), len(ids))
	if n := len(survivor.runs()); n == 0 {
		t.Error("the surviving worker ran nothing")
	}
	survivor.stop()
	assertNoLeaks(t)
}

// TestWorkerMaxDeliverWithoutAnswer: a task whose last delivery dies with
// its worker gets an error result from another worker, naming the
// deliveries, and leaves the stream.
func TestWorkerMaxDeliverWithoutAnswer(t *testing.T) {
	ns := startNATS(t)
	cg := sampleCgroups()
	defer cg.end()
	over := map[string]any{"nats": []string{ns.url()}, "slots": 1, "max_deliver": 1}
	victim := startWorker(t, over)
	b := dialBus(t, ns.url())
	b.publish("lost-1", `{"id":"lost-1","command":["sleep","30"]}`)
	for deadline := time.Now().Add(15 * time.Second); len(cg.runsOf(victim.cmd.Process.Pid)) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the worker ran nothing: %s", victim.log())
		}
	}
	other := startWorker(t, over)
	victim.cmd.Process.Kill()
	victim.cmd.Wait()
	if err := gcCLI(t); err != nil {
		t.Fatal(err)
	}
	res := b.results([]string{"lost-1"}, 20*time.Second)["lost-1"]
	if !strings.Contains(res.Error, "delivered 1 times (max_deliver) and never answered") {
		t.Errorf("lost-1: error %q", res.Error)
	}
	if ci := b.consumer(); ci.NumPending != 0 || ci.NumAckPending != 0 {
		t.Errorf("lost-1 still in the stream: %+v", ci)
	}
	other.stop()
	assertNoLeaks(t)
}

// TestWorkerNATSRestart: nats-server restarts while tasks run; the workers
// reconnect, and every task gets its one result.
func TestWorkerNATSRestart(t *testing.T) {
	ns := startNATS(t)
	w := startWorker(t, map[string]any{"nats": []string{ns.url()}, "slots": 3, "ack_wait": "5s"})
	b := dialBus(t, ns.url())
	ids, _ := sleepTasks(b, "restart", 9, "1")
	time.Sleep(500 * time.Millisecond) // the first three are running
	ns.stop(syscall.SIGTERM)
	time.Sleep(time.Second)
	ns.start()
	checkEcho(t, b, b.results(ids, 40*time.Second), len(ids))
	w.stop()
	assertNoLeaks(t)
}

// TestWorkerClusterFailover: with the stream and bucket at 3 replicas on
// a three-node cluster, one server killed mid-load loses nothing.
func TestWorkerClusterFailover(t *testing.T) {
	ss := startCluster(t)
	var urls []string
	for _, s := range ss {
		urls = append(urls, s.url())
	}
	// The cluster elects its JetStream leader first.
	b := dialBus(t, urls...)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := b.js.AccountInfo(ctx)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("JetStream cluster not ready: %v\n%s", err, ss[0].logText())
		}
	}
	over := map[string]any{"nats": urls, "slots": 3, "replicas": 3, "ack_wait": "5s"}
	w1 := startWorker(t, over)
	w2 := startWorker(t, over)
	ids, _ := sleepTasks(b, "cluster", 24, "0.5")
	time.Sleep(time.Second)
	// Kill the stream's leader.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	st, err := b.js.Stream(ctx, "AGENTRUN")
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	ci := st.CachedInfo().Cluster
	if ci == nil || len(ci.Replicas) != 2 {
		t.Fatalf("stream not replicated on 3 servers: %+v", ci)
	}
	killed := false
	for _, s := range ss {
		if s.name == ci.Leader {
			s.stop(syscall.SIGKILL)
			killed = true
		}
	}
	if !killed {
		t.Fatalf("stream leader %q is none of the servers", ci.Leader)
	}
	checkEcho(t, b, b.results(ids, 50*time.Second), len(ids))
	w1.stop()
	w2.stop()
	assertNoLeaks(t)
}

// TestWorkerSIGTERMAndBounds: a result larger than NATS carries is stored
// without its output, saying so; a task whose id differs from its
// message's is refused; on SIGTERM a worker takes no more tasks, finishes
// the one it runs, stores its result and exits 0.
func TestWorkerSIGTERMAndBounds(t *testing.T) {
	ns := startNATS(t)
	w := startWorker(t, map[string]any{"nats": []string{ns.url()}, "slots": 1})
	b := dialBus(t, ns.url())

	b.publish("big-1", `{"id":"big-1","command":["sh","-c","head -c 1100000 /dev/zero | tr '\\0' a"],"limits":{"output_bytes":1048576}}`)
	b.publish("other-1", `{"id":"mismatch","command":["true"]}`)
	got := b.results([]string{"big-1", "other-1"}, 20*time.Second)
	big := got["big-1"]
	if big.Stdout != "" || big.StdoutBytes != 1100000 || !big.StdoutTruncated || !strings.Contains(big.Error, "more than NATS carries") {
		t.Errorf("big-1: %d bytes of stdout kept, stdout_bytes %d, error %q", len(big.Stdout), big.StdoutBytes, big.Error)
	}
	if e := got["other-1"].Error; !strings.Contains(e, `task: id: "mismatch" is not the message's Nats-Msg-Id "other-1"`) {
		t.Errorf("other-1: error %q", e)
	}

	b.publish("term-1", `{"id":"term-1","command":["sh","-c","sleep 2; echo done"]}`)
	b.publish("term-2", `{"id":"term-2","command":["echo","never"]}`)
	for deadline := time.Now().Add(15 * time.Second); b.consumer().NumAckPending == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("term-1 never started")
		}
	}
	w.stop()
	if res := b.results([]string{"term-1"}, time.Second)["term-1"]; res.Stdout != "done\n" || res.Error != "" {
		t.Errorf("term-1, running at SIGTERM: %+v", res)
	}
	if ci := b.consumer(); ci.NumPending != 1 || ci.NumAckPending != 0 {
		t.Errorf("after SIGTERM: %d tasks waiting, %d taken; want term-2 waiting, nothing taken", ci.NumPending, ci.NumAckPending)
	}
	assertNoLeaks(t)
}

// TestWorkerLiveOutput: a task's output comes on its event subject while
// it runs, before its result is stored; submit --follow writes it to
// stderr and the result to stdout.
func TestWorkerLiveOutput(t *testing.T) {
	ns := startNATS(t)
	w := startWorker(t, map[string]any{"nats": []string{ns.url()}, "slots": 1})
	b := dialBus(t, ns.url())
	events := make(chan *nats.Msg, 16)
	sub, err := b.nc.ChanSubscribe("agentrun.events.live-1", events)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	b.nc.Flush()
	b.publish("live-1", `{"id":"live-1","command":["sh","-c","echo first; sleep 1; echo second >&2"]}`)
	select {
	case m := <-events:
		var ev worker.Event
		if err := json.Unmarshal(m.Data, &ev); err != nil || ev != (worker.Event{Stream: "stdout", Data: "first\n"}) {
			t.Errorf("first event: %v %+v", err, ev)
		}
		if _, err := worker.Get(context.Background(), b.kv(), "live-1"); err == nil {
			t.Error("the result was stored before the first output came")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no live output within 10s")
	}
	b.results([]string{"live-1"}, 10*time.Second)

	cfg := writeConfig(t, map[string]any{"worker": map[string]any{"nats": []string{ns.url()}}})
	cmd := exec.Command(agentrunBin(t), "submit", "--config", cfg, "--follow", "-")
	cmd.Stdin = strings.NewReader(`{"command":["sh","-c","echo out; echo err >&2; sleep 0.3"]}`)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("submit --follow: %v: %s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "out\n") || !strings.Contains(stderr.String(), "err\n") {
		t.Errorf("submit --follow: stderr %q", stderr.String())
	}
	if !strings.Contains(stdout.String(), `"stdout": "out\n"`) {
		t.Errorf("submit --follow: stdout %q", stdout.String())
	}
	w.stop()
	assertNoLeaks(t)
}

// TestWorkerUsesItsPool: a worker with server.pool runs a task of the
// pooled shape in the sandbox it had ready (the result's id is that
// sandbox's cgroup), and empties its pool on SIGTERM.
func TestWorkerUsesItsPool(t *testing.T) {
	ns := startNATS(t)
	cg := sampleCgroups()
	defer cg.end()
	w := startWorkerCfg(t, map[string]any{"nats": []string{ns.url()}, "slots": 1},
		map[string]any{"image": pythonImage, "server": map[string]any{"pool": map[string]int{pythonImage: 1}}})
	var ready []string
	for deadline := time.Now().Add(20 * time.Second); len(ready) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no pooled sandbox: %s", w.log())
		}
		ready = cg.runsOf(w.cmd.Process.Pid)
	}
	// Its cgroup comes before the rest of its set-up: let that end.
	time.Sleep(time.Second)
	b := dialBus(t, ns.url())
	b.publish("pool-1", `{"id":"pool-1","code":"print(45)"}`)
	res := b.results([]string{"pool-1"}, 20*time.Second)["pool-1"]
	if res.Stdout != "45\n" || res.ID != ready[0] {
		t.Errorf("pool-1: id %s, stdout %q, error %q; want it run in the pooled sandbox %s", res.ID, res.Stdout, res.Error, ready[0])
	}
	w.stop()
	assertNoLeaks(t)
}
