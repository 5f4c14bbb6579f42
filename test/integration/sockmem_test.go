package integration

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentrun/agentrun/runtime/cgroup"
)

// fillSocketsPy opens loopback TCP connections inside the sandbox's own
// network namespace, never reads them, and writes to each until the kernel
// takes no more, until it runs out of file descriptors or memory for
// sockets; then it prints the bytes queued and holds them a while.
const fillSocketsPy = `
import socket, time
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1024)
port = srv.getsockname()[1]
blob = b"x" * 65536
queued, pairs, stop = 0, [], ""
deadline = time.time() + 12
while time.time() < deadline:
    try:
        c = socket.create_connection(("127.0.0.1", port), timeout=2)
        s, _ = srv.accept()
    except OSError as e:
        stop = type(e).__name__
        break
    c.setblocking(False)
    pairs.append((c, s))
    while time.time() < deadline:
        try:
            queued += c.send(blob)
        except BlockingIOError:
            break
print(queued, len(pairs), stop, flush=True)
time.sleep(2)
`

// TestSocketBuffersCharged fills loopback TCP send buffers from a 64 MiB
// sandbox with no reader. The socket memory must count against the run:
// on cgroup v1 the memory controller's TCP cap holds it to the memory
// limit, on cgroup v2 it is charged to the run's memory (the reported peak
// covers it). Either way the host's MemAvailable must not fall by more
// than socketMemBound while the sandbox holds its buffers.
func TestSocketBuffersCharged(t *testing.T) {
	const limit = 64 << 20
	// The sandbox's own memory and its socket buffers (two limits' worth on
	// v1, where they are capped apart) and room for the rest of the host.
	const socketMemBound = 2*limit + 320<<20
	v2 := cgroup.Unified()
	if !v2 {
		if _, err := os.Stat("/sys/fs/cgroup/memory/memory.kmem.tcp.limit_in_bytes"); err != nil {
			t.Fatalf("cgroup v1 without TCP memory accounting: %v", err)
		}
	}

	before := memAvailable(t)
	lowest := before
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				lowest = min(lowest, memAvailable(t))
			}
		}
	})
	res := runIn(t, "libcontainer", pyTask(fillSocketsPy, map[string]any{
		"limits": map[string]any{"memory": "64m", "timeout": "30s"},
	}))
	close(done)
	wg.Wait()

	fields := strings.Fields(res.Stdout)
	if len(fields) < 2 {
		t.Fatalf("exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	queued, _ := strconv.ParseInt(fields[0], 10, 64)
	pairs, _ := strconv.Atoi(fields[1])
	drop := before - lowest
	t.Logf("cgroup v2 %v: %d connections, %d MiB queued, peak %d MiB, host MemAvailable fell by %d MiB (bound %d MiB)",
		v2, pairs, queued>>20, res.MemoryPeakBytes>>20, drop>>20, socketMemBound>>20)
	// Positive control: the sandbox did fill socket buffers.
	if pairs < 2 || queued < 8<<20 {
		t.Fatalf("the program queued only %d bytes over %d connections; the test proves nothing", queued, pairs)
	}
	// The kernel lets each connection queue one segment past the cap, on
	// each side (at most half a 256 KiB window).
	if perConn := int64(64 << 10); !v2 && queued > limit+int64(pairs)*perConn {
		t.Errorf("cgroup v1: %d MiB queued in socket buffers over %d connections by a %d MiB sandbox; want at most the limit plus %d KiB a connection",
			queued>>20, pairs, limit>>20, perConn>>10)
	}
	// The run is charged for what it queued: the reported peak covers it.
	if res.MemoryPeakBytes < queued {
		t.Errorf("memory peak %d MiB is below the %d MiB the program held in socket buffers", res.MemoryPeakBytes>>20, queued>>20)
	}
	if drop > socketMemBound {
		t.Errorf("host MemAvailable fell by %d MiB; bound %d MiB", drop>>20, socketMemBound>>20)
	}
}

// memAvailable reads the host's MemAvailable in bytes.
func memAvailable(t testing.TB) int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var kb int64
		if n, _ := fmt.Sscanf(sc.Text(), "MemAvailable: %d kB", &kb); n == 1 {
			return kb << 10
		}
	}
	t.Fatal("no MemAvailable in /proc/meminfo")
	return 0
}
