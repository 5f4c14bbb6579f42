package metrics

import (
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// writeRuntime writes the Go runtime's and the process's series, under
// the names Prometheus's own collectors use. Everything is read at scrape
// time; nothing is set up before.
func writeRuntime(b *strings.Builder, started time.Time) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	var gc debug.GCStats
	debug.ReadGCStats(&gc)

	header(b, "go_info", "gauge", "The Go version agentrun was built with.")
	b.WriteString("go_info{" + labels("version", runtime.Version()) + "} 1\n")
	single(b, "go_goroutines", "gauge", "Goroutines that currently exist.", float64(runtime.NumGoroutine()))
	single(b, "go_gc_cycles_total", "counter", "Completed GC cycles.", float64(ms.NumGC))
	single(b, "go_gc_pause_seconds_total", "counter", "Time the GC stopped the world.", gc.PauseTotal.Seconds())
	single(b, "go_memstats_alloc_bytes", "gauge", "Bytes of heap objects allocated and in use.", float64(ms.Alloc))
	single(b, "go_memstats_alloc_bytes_total", "counter", "Bytes allocated for heap objects in all.", float64(ms.TotalAlloc))
	single(b, "go_memstats_sys_bytes", "gauge", "Bytes obtained from the OS.", float64(ms.Sys))
	single(b, "go_memstats_heap_inuse_bytes", "gauge", "Bytes in in-use heap spans.", float64(ms.HeapInuse))
	single(b, "go_memstats_heap_idle_bytes", "gauge", "Bytes in idle heap spans.", float64(ms.HeapIdle))
	single(b, "go_memstats_heap_objects", "gauge", "Allocated heap objects.", float64(ms.HeapObjects))
	single(b, "go_memstats_stack_inuse_bytes", "gauge", "Bytes in stack spans.", float64(ms.StackInuse))
	single(b, "go_memstats_next_gc_bytes", "gauge", "Heap size at which the next GC starts.", float64(ms.NextGC))

	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		single(b, "process_cpu_seconds_total", "counter", "User and system CPU time.", cpu.Seconds())
	}
	if data, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := strings.Fields(string(data)); len(f) >= 2 {
			page := float64(os.Getpagesize())
			if v, err := strconv.ParseFloat(f[0], 64); err == nil {
				single(b, "process_virtual_memory_bytes", "gauge", "Virtual memory size.", v*page)
			}
			if v, err := strconv.ParseFloat(f[1], 64); err == nil {
				single(b, "process_resident_memory_bytes", "gauge", "Resident memory size.", v*page)
			}
		}
	}
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		single(b, "process_open_fds", "gauge", "Open file descriptors.", float64(len(fds)))
	}
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil {
		single(b, "process_max_fds", "gauge", "The limit of open file descriptors.", float64(lim.Cur))
	}
	single(b, "process_start_time_seconds", "gauge", "When serve started, seconds since the epoch.", float64(started.UnixNano())/1e9)
}
