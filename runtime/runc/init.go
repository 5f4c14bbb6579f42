package runc

import (
	"fmt"
	"os"
	"runtime"

	"github.com/opencontainers/runc/libcontainer"
	// The cgo constructor that joins namespaces before the Go runtime starts.
	_ "github.com/opencontainers/runc/libcontainer/nsenter"
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

// A container's init is this package's own init, not main's: Go
// initializes a package as soon as what it imports is, so the init starts
// with libcontainer's dependencies initialized but before the packages
// that only the rest of agentrun needs (its server, image store, MCP and
// worker), whose package inits each container's init would otherwise pay
// for.
func init() { containerInit() }

// containerInit turns this process into a container's init when
// libcontainer started it as one (argv[1] == "init" and libcontainer's
// init pipe set); libcontainer.Init never returns. Otherwise it returns.
func containerInit() {
	if len(os.Args) > 1 && os.Args[1] == "init" && os.Getenv("_LIBCONTAINER_INITPIPE") != "" {
		if err := installNativeABIFilter(); err != nil {
			// The parent sees the init fail, and the run with it.
			fmt.Fprintln(os.Stderr, "agentrun init:", err)
			os.Exit(1)
		}
		libcontainer.Init()
	}
}
