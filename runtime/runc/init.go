package runc

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"

	"github.com/opencontainers/runc/libcontainer"
	"github.com/sirupsen/logrus"
	// The cgo constructor that joins namespaces before the Go runtime starts.
	_ "github.com/opencontainers/runc/libcontainer/nsenter"

	// The constructor that maps the binary's code, after nsexec's.
	_ "github.com/agentrun/agentrun/runtime/runc/prefault"
)

// InitHook turns this process into a container's init when libcontainer
// started it as one (argv[1] == "init" and libcontainer's init pipe set);
// libcontainer.Init never returns.
//
// Otherwise it locks the main goroutine to the main thread and returns.
// libcontainer moves short-lived locked threads into a container's mount
// namespace and lets them die; Go cannot end the main thread, so one that
// ran such a goroutine would stay in that namespace for good, keeping the
// container's mounts alive and changing what /proc/self shows. With main
// locked, no other goroutine ever runs on the main thread.
func InitHook() {
	containerInit()
	runtime.LockOSThread()
}

// A container's init is this package's own init, not main's, so that it
// starts before the packages that Go initializes after this one. Those
// are few: Go initializes, at each step, the first package in import-path
// order whose imports are initialized, and most of the binary's packages
// (the server's, the image store's, MCP's and the worker's, with their
// libraries) sort before libcontainer or wait for nothing it does. So a
// container's init runs 169 of the binary's 187 package inits before this
// one (GODEBUG=inittrace=1: 3.7 of 4.1 ms). A separate init binary,
// embedded and executed from a sealed memfd, was measured and dropped:
// the copy into the memfd (4 ms per process) and the exec from shmem cost
// what the inits saved.
func init() { containerInit() }

// containerInit turns this process into a container's init when
// libcontainer started it as one (argv[1] == "init" and libcontainer's
// init pipe set); libcontainer.Init never returns. Otherwise it returns.
func containerInit() {
	if len(os.Args) > 1 && os.Args[1] == "seccomp-capture" && os.Getenv(captureEnv) == "1" {
		captureMain()
	}
	if len(os.Args) > 1 && os.Args[1] == "init" && os.Getenv("_LIBCONTAINER_INITPIPE") != "" {
		if err := installNativeABIFilter(); err != nil {
			// The parent sees the init fail, and the run with it.
			fmt.Fprintln(os.Stderr, "agentrun init:", err)
			os.Exit(1)
		}
		libcontainer.Init()
	}
}

// warmJSON builds encoding/json's encoders of libcontainer's container
// state, the container's config inside it: by reflection, once per type
// and process, about a millisecond on the way of every cold run
// otherwise, where the CLI marshals the config to the container's init
// and saves the state. A goroutine does it beside the CLI's wait for the
// init's namespaces. (Not in the init: its config is there before its Go
// runtime is, so nothing would overlap, and with one P it only added CPU.)
func warmJSON() { _, _ = json.Marshal(&libcontainer.State{}) }

// logLevel is the level of logrus (the CLI's: warnings) as the container's
// init and nsexec read it (_LIBCONTAINER_LOGLEVEL, as runc's CLI passes
// it). Without it nsexec logs at debug level: two dozen JSON lines over
// the log pipe in every start, each parsed by the parent and dropped.
func logLevel() string { return strconv.Itoa(int(logrus.GetLevel())) }

// warmJSONOnce starts warmJSON in a process's first Prepare.
var warmJSONOnce sync.Once
