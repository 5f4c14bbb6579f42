package runc

import (
	"os"

	"github.com/opencontainers/runc/libcontainer"
	// The cgo constructor that joins namespaces before the Go runtime starts.
	_ "github.com/opencontainers/runc/libcontainer/nsenter"
)

// InitHook turns this process into a container's init when libcontainer
// started it as one (argv[1] == "init" and libcontainer's init pipe set);
// otherwise it returns at once. libcontainer.Init never returns.
func InitHook() {
	if len(os.Args) > 1 && os.Args[1] == "init" && os.Getenv("_LIBCONTAINER_INITPIPE") != "" {
		libcontainer.Init()
	}
}
