//go:build linux && amd64

// Command probe is agentrun's escape-probe battery. It runs inside a sandbox
// as its first process and tries, one by one, the numbered ways out that
// docs/escape-libcontainer.md and docs/escape-runsc.md report on. Every
// negative probe is paired with a positive control that shows the probing
// mechanism itself works, so that "blocked" never just means "the probe
// was broken".
//
// The report goes to stdout as one JSON object, {"probes":[...]}, written one
// probe per line as each finishes, so that a crash mid-way still leaves every
// finished probe readable line by line.
//
// The probe refuses to run outside a sandbox (it must be pid 1 of its pid
// namespace, the child of a sandbox's init, or exec'd into a live sandbox,
// and not root): several probes would change a host if they
// succeeded there. Run with elevated ids (a setuid or file-capability copy of
// it), it only reports who it is and exits.
//
// It uses raw syscalls with explicit x86-64 numbers wherever a library
// wrapper could hide or rewrite the result.

// The Go runtime must not read or keep open cgroup files of its own (for
// GOMAXPROCS): the fd probe counts every open descriptor.
//
//go:debug containermaxprocs=0
//go:debug updatemaxprocs=0
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"

	"github.com/agentrun/agentrun/internal/uidpool"
	"golang.org/x/sys/unix"
)

// Probe is one line of the report.
type Probe struct {
	ID        string `json:"id"`
	Item      int    `json:"item"` // the checklist number; 0 for extras
	Name      string `json:"name"`
	Category  string `json:"category"`
	Blocked   bool   `json:"blocked"`
	Errno     string `json:"errno,omitempty"` // the negative probe's errno, symbolic
	Detail    string `json:"detail"`
	ControlOK bool   `json:"control_ok"`
	Control   string `json:"control"`              // what the control did and what it got
	NotProbed string `json:"not_probed,omitempty"` // why the probe could not run; Blocked is then meaningless
	Info      bool   `json:"info,omitempty"`       // informational: recorded, never a pass or fail
}

// Options are the command-line flags the harness passes.
type Options struct {
	Abstract     string // an abstract unix socket name bound in the host netns
	HostPort     int    // a TCP port the harness listens on, on all host addresses
	HostIPs      []string
	HostHostname string
	HostPaths    []string // host paths that must not appear in mountinfo
	ImagePath    string   // the image's host directory (informational leak check)
	Pids         int      // the run's pids limit
	TmpSize      int64    // the run's /tmp size in bytes
	SuidPath     string   // a setuid-root copy of the probe in the image
	FcapsPath    string   // a copy of the probe in the image with effective file capabilities
	FcapsNoEff   string   // a copy with permitted file capabilities, effective bit clear
	UIDFirst     int64    // the config's run_uids: the sandbox's uid and gid is one of them
	UIDCount     int64
}

var (
	outMu   sync.Mutex
	nOut    int
	selfExe = "/proc/self/exe"
)

func emit(p *Probe) {
	b, err := json.Marshal(p)
	if err != nil {
		b = []byte(fmt.Sprintf(`{"id":%q,"detail":"marshal: %v"}`, p.ID, err))
	}
	outMu.Lock()
	defer outMu.Unlock()
	sep := ","
	if nOut == 0 {
		sep = ""
	}
	nOut++
	os.Stdout.Write([]byte(sep + "\n" + string(b)))
}

func main() {
	// Helper modes first: they are the children some probes start.
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "-noop":
			os.Exit(0)
		case "-whoami":
			whoami()
			return
		case "-pause":
			pause()
			return
		case "-int80":
			int80Child(os.Args[2:])
			return
		case "-x32":
			x32Child(os.Args[2:])
			return
		case "-ioctl":
			ioctlChild(os.Args[2:])
			return
		case "-forkbomb":
			forkBombChild(os.Args[2:])
			return
		case "-rawclone":
			rawCloneChild(os.Args[2:])
			return
		}
	}
	// A setuid or file-capability copy only says who it is.
	if os.Geteuid() != os.Getuid() || os.Getegid() != os.Getgid() || os.Geteuid() == 0 {
		whoami()
		return
	}

	var o Options
	var hostIPs, hostPaths string
	flag.StringVar(&o.Abstract, "abstract", "", "abstract unix socket `name` bound by the harness in the host network namespace")
	flag.IntVar(&o.HostPort, "hostport", 0, "TCP `port` the harness listens on on every host address")
	flag.StringVar(&hostIPs, "hostips", "", "comma-separated host IP addresses to try -hostport on")
	flag.StringVar(&o.HostHostname, "hosthostname", "", "the host's hostname, which the sandbox must not see")
	flag.StringVar(&hostPaths, "hostpaths", "/run/agentrun,/var/lib/agentrun,/var/lib/docker,docker.sock,containerd.sock", "comma-separated host paths that must not appear in mountinfo")
	flag.StringVar(&o.ImagePath, "imagepath", "", "the image's directory on the host")
	flag.IntVar(&o.Pids, "pids", 64, "the run's pids limit")
	flag.Int64Var(&o.TmpSize, "tmpsize", 64<<20, "the run's /tmp size in bytes")
	flag.StringVar(&o.SuidPath, "suid", "", "a setuid-root copy of this program in the image")
	flag.StringVar(&o.FcapsPath, "fcaps", "", "a copy of this program in the image with every file capability, effective")
	flag.StringVar(&o.FcapsNoEff, "fcaps-noeff", "", "a copy of this program in the image with every file capability permitted, not effective")
	flag.Int64Var(&o.UIDFirst, "uid-first", uidpool.DefaultFirst, "the first id of the config's run_uids")
	flag.Int64Var(&o.UIDCount, "uid-count", uidpool.DefaultCount, "the number of ids of the config's run_uids")
	force := flag.Bool("i-am-in-a-sandbox", false, "run even though this process is not pid 1")
	flag.Parse()
	o.HostIPs = splitList(hostIPs)
	o.HostPaths = splitList(hostPaths)

	if !inSandbox() && !*force {
		fmt.Fprintln(os.Stderr, "probe: refusing to run: neither pid 1 of a pid namespace nor a child of the sandbox's init (not in a sandbox?); some probes would change a host if they succeeded")
		os.Exit(2)
	}
	// Syscalls that change per-thread state (setuid, personality, unshare)
	// stay on this thread.
	runtime.LockOSThread()

	os.Stdout.Write([]byte(`{"version":1,"probes":[`))
	for _, p := range allProbes(&o) {
		pr := &Probe{ID: p.id, Item: p.item, Name: p.name, Category: p.cat}
		func() {
			defer func() {
				if r := recover(); r != nil {
					pr.Blocked, pr.ControlOK = false, false
					pr.Detail = fmt.Sprintf("probe panicked: %v", r)
				}
			}()
			p.run(pr)
		}()
		emit(pr)
	}
	os.Stdout.Write([]byte("\n]}\n"))
}

// probeDef is one entry of the battery.
type probeDef struct {
	id, name, cat string
	item          int
	run           func(*Probe)
}

// allProbes is the battery, in order. The fd probe comes first, before this
// program opens anything; the fork bomb comes last.
func allProbes(o *Options) []probeDef {
	var ps []probeDef
	ps = append(ps, fdProbes()...)
	ps = append(ps, fsProbes(o)...)
	ps = append(ps, procSysProbes(o)...)
	ps = append(ps, privProbes(o)...)
	ps = append(ps, syscallProbes()...)
	ps = append(ps, abiProbes()...)
	ps = append(ps, socketProbes()...)
	ps = append(ps, surfaceProbes()...)
	ps = append(ps, netProbes(o)...)
	ps = append(ps, resourceProbes(o)...)
	return ps
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// inSandbox reports whether the probe runs as pid 1 of a pid namespace,
// or as the child of a sandbox's init or exec'd into its namespace: pid 1
// is /dev/init, which no host runs as its init.
func inSandbox() bool {
	if os.Getpid() == 1 {
		return true
	}
	// Raw calls: os.ReadFile would start the runtime's poller, whose fds
	// the fd probes would then find open.
	fd, err := unix.Open("/proc/1/cmdline", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	b := make([]byte, 64)
	n, _ := unix.Read(fd, b)
	// A child of the sandbox's init (a run's program under the seccomp
	// helper), or a process exec'd into a live sandbox, whose parent is
	// outside its pid namespace (ppid 0; on a host only pid 1 and
	// kthreadd have none): either way pid 1 is the sandbox's init.
	ppid := os.Getppid()
	return n > 0 && (ppid == 1 || ppid == 0) && strings.HasPrefix(string(b[:n]), "/dev/init\x00")
}
