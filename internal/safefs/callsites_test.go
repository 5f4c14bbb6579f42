package safefs

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// scanned are the packages (with those below them) that handle trees a
// sandbox writes, or sit beside them: every file system call of theirs by
// path is either in allowed, with the reason it does not reach into such a
// tree, or goes through safefs.
var scanned = []string{
	"internal/runner", "internal/launcher", "internal/workspace", "internal/session", "internal/state",
	"internal/uidpool", "internal/toolbroker", "internal/server", "internal/mcpserver",
	"internal/worker", "internal/sandbox", "runtime/runc", "runtime/runsc", "runtime/backend",
}

// pathCalls are the calls, by package import path, that resolve a path
// name: each one a way into a tree past safefs.
var pathCalls = map[string][]string{
	"os": {"Create", "CreateTemp", "Chmod", "Chown", "Chtimes", "DirFS", "Lchown", "Link", "Lstat", "Mkdir",
		"MkdirAll", "MkdirTemp", "Open", "OpenFile", "OpenInRoot", "OpenRoot", "ReadDir", "ReadFile", "Readlink",
		"Remove", "RemoveAll", "Rename", "Stat", "Symlink", "Truncate", "WriteFile"},
	"golang.org/x/sys/unix": {"Chmod", "Chown", "Lchown", "Lstat", "Mkdir", "Mkdirat", "Mkfifo", "Open", "Openat",
		"Openat2", "Rename", "Renameat", "Renameat2", "Stat", "Symlink", "Unlink", "Unlinkat"},
	"syscall":       {"Open", "Openat", "Lstat", "Stat", "Unlink", "Rename", "Mkdir"},
	"path/filepath": {"Glob", "Walk", "WalkDir"},
}

// Reasons shared by many sites.
const (
	stateDir  = "host-only: the state dir's bookkeeping (root's, 0700, never mounted in a sandbox)"
	runDir    = "host-only: the run dir itself, root's, of which a sandbox is shown only mounts of subdirectories"
	etcTmpfs  = "host-only: the run's etc tmpfs, which a sandbox sees read-only"
	binDir    = "host-only: BinDir, agentrun's staged binaries, read-only in a sandbox"
	imageRead = "the image's rootfs, read at set-up before any sandbox process runs in it; an image's links are its layout and os.Root keeps them inside"
	procSys   = "host-only: /proc or /sys of the host"
	store     = "host-only: the session store's directories and disk image files, its kept state and its created time (a sandbox writes inside the disk's file system, never these)"
	removeAll = "os.RemoveAll walks with openat(O_NOFOLLOW) and unlinkat: it never follows a link, and the sandbox is dead and its mounts gone"
	runscDir  = "host-only: runsc's root, bundle and log files of runsc's own host processes"
	runcDir   = "host-only: libcontainer's state dir"
	config    = "host-only: a path the config names"
	sockDir   = "host-only: serve's socket directory"
	toolsDir  = "host-only: the tool servers' dir in the state dir (root's, 0700, never mounted in a sandbox or a tool server's view)"
	fence     = "a tool server's fence, in its own mount namespace before its command runs: the host's /etc and the fresh tmpfs the fence mounted, which nothing of a sandbox's or a server's has written"
)

// allowed are the path calls of scanned that do not reach into a tree a
// sandbox could write, keyed file:function:call (a method as
// Type.Method), each with why.
var allowed = map[string]string{
	"internal/runner/stamp.go:readStamp:os.OpenFile":                 binDir,
	"internal/runner/stamp.go:stampedCopy:syscall.Lstat":             binDir,
	"internal/runner/stamp.go:writeStamp:os.CreateTemp":              binDir,
	"internal/runner/stamp.go:writeStamp:os.Remove":                  binDir,
	"internal/runner/stamp.go:writeStamp:os.Rename":                  binDir,
	"internal/runner/stamp.go:writeStamp:syscall.Lstat":              binDir,
	"internal/session/session.go:Store.created:os.OpenFile":          store,
	"internal/session/session.go:writeCreated:os.OpenFile":           store,
	"internal/session/state.go:Lease.NewState:os.OpenFile":           store,
	"internal/session/state.go:Lease.ResetState:os.Remove":           store,
	"internal/session/state.go:Lease.State:os.OpenFile":              store,
	"internal/session/state.go:Lease.SyncState:os.OpenFile":          store,
	"internal/session/state.go:StateWriter.Abort:os.Remove":          store,
	"internal/session/state.go:StateWriter.Commit:os.Remove":         store,
	"internal/session/state.go:StateWriter.Commit:os.Rename":         store,
	"internal/runner/tools.go:Runner.toolNetwork:os.Open":            "host-only: the network namespace netns made for a tool server, by its bind mount in the state dir",
	"internal/toolbroker/broker.go:ReclaimShared:os.OpenFile":        toolsDir,
	"internal/toolbroker/broker.go:ReclaimShared:os.Remove":          toolsDir,
	"internal/toolbroker/broker.go:Shared.Close:os.Remove":           toolsDir,
	"internal/toolbroker/broker.go:Shared.uidOwner:os.MkdirAll":      toolsDir,
	"internal/toolbroker/fence.go:bindTarget:os.MkdirAll":            fence,
	"internal/toolbroker/fence.go:bindTarget:os.OpenFile":            fence,
	"internal/toolbroker/fence.go:bindTarget:os.Readlink":            fence,
	"internal/toolbroker/fence.go:bindTarget:os.Stat":                fence,
	"internal/toolbroker/fence.go:fenceMounts:os.Lstat":              fence,
	"internal/toolbroker/fence.go:fenceNetwork:os.MkdirTemp":         fence,
	"internal/toolbroker/fence.go:fenceNetwork:os.RemoveAll":         fence,
	"internal/toolbroker/fence.go:fenceNetwork:os.WriteFile":         fence,
	"internal/launcher/code.go:pruneLauncherCodes:os.ReadDir":        "host-only: the cache of the run launcher's bytecode (root's, 0700)",
	"internal/launcher/code.go:pruneLauncherCodes:os.Remove":         "host-only: the cache of the run launcher's bytecode (root's, 0700)",
	"internal/launcher/launcher.go:values:os.Mkdir":                  runDir,
	"internal/runner/bindir.go:copyInto:os.Open":                     "host-only: the host binary being staged, which the init's checks passed",
	"internal/runner/bindir.go:isTmpfsMount:unix.Lstat":              binDir,
	"internal/runner/bindir.go:isTmpfsMount:unix.Stat":               binDir,
	"internal/runner/bindir.go:mountBinDir:os.Mkdir":                 binDir,
	"internal/runner/bindir.go:mountBinDir:os.MkdirAll":              binDir,
	"internal/runner/bindir.go:pruneCopies:os.ReadDir":               binDir,
	"internal/runner/bindir.go:pruneCopies:os.Remove":                binDir,
	"internal/runner/bindir.go:sameCopy:os.OpenFile":                 binDir,
	"internal/runner/bindir.go:StageBinary:os.Lstat":                 binDir,
	"internal/runner/bindir.go:StageBinary:os.Stat":                  "host-only: the host binary being staged",
	"internal/runner/bindir.go:writeCopy:os.CreateTemp":              binDir,
	"internal/runner/bindir.go:writeCopy:os.Remove":                  binDir,
	"internal/runner/bindir.go:writeCopy:os.Rename":                  binDir,
	"internal/runner/gc.go:Runner.cleanRun:os.RemoveAll":             removeAll,
	"internal/runner/gc.go:deadRunOwner:os.Lstat":                    runDir,
	"internal/runner/gc.go:Runner.gcRuns:os.ReadDir":                 stateDir,
	"internal/runner/identity.go:identity:os.OpenRoot":               imageRead,
	"internal/runner/identity.go:mountEtc:os.Mkdir":                  runDir,
	"internal/runner/identity.go:writeEtc:os.Lstat":                  runDir,
	"internal/runner/identity.go:writeEtc:os.MkdirAll":               etcTmpfs,
	"internal/runner/identity.go:writeEtc:os.WriteFile":              etcTmpfs,
	"internal/runner/pool.go:shapeKey:unix.Stat":                     "the image store's rootfs directory itself, never a sandbox's",
	"internal/runner/rootfs.go:checkProgram:os.OpenRoot":             imageRead,
	"internal/runner/rootfs.go:mountOverlay:os.Chmod":                "host-only: the overlay's upper directory, made just before, before the overlay is mounted",
	"internal/runner/rootfs.go:mountOverlay:os.Mkdir":                runDir,
	"internal/runner/rootfs.go:mountOverlay:os.OpenFile":             "the image's rootfs and the overlay's directories just made, opened O_PATH to name them to the mount",
	"internal/runner/runner.go:New:os.MkdirAll":                      stateDir,
	"internal/runner/runner.go:sandboxSetup.register:os.RemoveAll":   removeAll,
	"internal/runner/services.go:readBounded:os.Open":                config,
	"internal/runner/services.go:trustCA:os.OpenRoot":                imageRead,
	"internal/runner/tools.go:Runner.cleanToolCgroups:filepath.Glob": "host-only: the cgroup file system",
	"internal/runner/tools.go:Runner.removeToolsParent:os.MkdirAll":  stateDir,
	"internal/server/listen.go:listen:os.Chmod":                      sockDir,
	"internal/server/listen.go:listen:os.Chown":                      sockDir,
	"internal/server/listen.go:listen:os.Remove":                     sockDir,
	"internal/server/listen.go:socketDir:os.Chmod":                   sockDir,
	"internal/server/listen.go:socketDir:os.Chown":                   sockDir,
	"internal/server/listen.go:socketDir:os.Mkdir":                   sockDir,
	"internal/server/listen.go:socketDir:os.MkdirAll":                sockDir,
	"internal/server/listen.go:socketDir:os.Stat":                    sockDir,
	"internal/session/copy.go:canClone:unix.Open":                    store,
	"internal/session/copy.go:copyFile:os.OpenFile":                  store,
	"internal/session/fork.go:Store.Fork:os.Mkdir":                   store,
	"internal/session/fork.go:Store.Fork:os.Rename":                  store,
	"internal/session/fork.go:newLock:os.OpenFile":                   store,
	"internal/session/fork.go:removeAll:os.RemoveAll":                store,
	"internal/session/fork.go:sourceFiles:os.ReadDir":                store,
	"internal/session/fork.go:sourceFiles:unix.Lstat":                store,
	"internal/session/loop.go:attach:os.OpenFile":                    store,
	"internal/session/loop.go:attached:filepath.Glob":                procSys,
	"internal/session/loop.go:attached:os.ReadFile":                  procSys,
	"internal/session/loop.go:clearMountPoint:os.Lstat":              "host-only: a mount point under the state dir, its mount gone",
	"internal/session/loop.go:clearMountPoint:os.Remove":             "host-only: a mount point under the state dir, its mount gone",
	"internal/session/loop.go:mountImage:os.Mkdir":                   "host-only: the mount point of a host-side access, under the state dir",
	"internal/session/loop.go:mountImage:os.Remove":                  "host-only: the mount point of a host-side access, under the state dir",
	"internal/session/loop.go:unmount:os.Remove":                     "host-only: a mount point under the state dir, unmounted",
	"internal/session/session.go:Lease.Release:os.Chtimes":           store,
	"internal/session/session.go:Open:os.MkdirAll":                   store,
	"internal/session/session.go:Store.Create:os.Chmod":              "the root of a disk mkfs has just made, which no sandbox has had",
	"internal/session/session.go:Store.Create:os.Mkdir":              store,
	"internal/session/session.go:Store.Create:os.OpenFile":           store,
	"internal/session/session.go:Store.Create:os.Remove":             "lost+found of a disk mkfs has just made, which no sandbox has had",
	"internal/session/session.go:Store.Create:os.RemoveAll":          store,
	"internal/session/session.go:Store.Create:os.Rename":             store,
	"internal/session/session.go:Store.GC:os.ReadDir":                store,
	"internal/session/session.go:Store.GC:os.RemoveAll":              store,
	"internal/session/session.go:Store.GC:os.Stat":                   store,
	"internal/session/session.go:Store.Get:unix.Lstat":               store,
	"internal/session/session.go:Store.busy:os.OpenFile":             store,
	"internal/session/session.go:Store.ids:os.ReadDir":               store,
	"internal/session/session.go:Store.lock:os.Lstat":                store,
	"internal/session/session.go:Store.lock:os.OpenFile":             store,
	"internal/session/session.go:Store.remove:os.RemoveAll":          store,
	"internal/session/session.go:Store.remove:os.Rename":             store,
	"internal/state/state.go:IDs:os.ReadDir":                         stateDir,
	"internal/state/state.go:Lock:os.OpenFile":                       stateDir,
	"internal/state/state.go:LockCgroupParent:os.OpenFile":           stateDir,
	"internal/state/state.go:Register:os.Mkdir":                      runDir,
	"internal/state/state.go:Register:os.RemoveAll":                  runDir,
	"internal/uidpool/idmap.go:userns:os.Open":                       procSys,
	"internal/uidpool/uidpool.go:HostNames:os.ReadFile":              config,
	"internal/uidpool/uidpool.go:Open:os.Mkdir":                      "host-only: the host's uid reservations (/run/agentrun/uids)",
	"internal/uidpool/uidpool.go:Open:os.MkdirAll":                   "host-only: the host's uid reservations (/run/agentrun/uids)",
	"internal/uidpool/uidpool.go:Range.Free:os.Readlink":             "host-only: the host's uid reservations (/run/agentrun/uids)",
	"internal/uidpool/uidpool.go:Range.Free:os.Remove":               "host-only: the host's uid reservations (/run/agentrun/uids)",
	"internal/uidpool/uidpool.go:Range.Held:os.ReadDir":              "host-only: the host's uid reservations (/run/agentrun/uids)",
	"internal/uidpool/uidpool.go:Range.Held:os.Readlink":             "host-only: the host's uid reservations (/run/agentrun/uids)",
	"internal/uidpool/uidpool.go:Range.Take:os.Symlink":              "host-only: the host's uid reservations (/run/agentrun/uids)",
	"internal/workspace/workspace.go:mountTmpfs:os.Mkdir":            "the workspace's (or a live sandbox's /tmp's) mount point in the run dir, before its tmpfs is mounted",
	"internal/workspace/workspace.go:mountTmpfs:os.Remove":           "the workspace's (or a live sandbox's /tmp's) mount point in the run dir, its tmpfs not mounted",
	"internal/workspace/workspace.go:Workspace.Close:os.Remove":      "the workspace's mount point in the run dir, once unmounted (an rmdir: a leftover mount or file makes it fail)",
	"runtime/backend/sockmem.go:ChargeSocketMemory:os.OpenFile":      "host-only: a cgroup v1 memory controller's file",
	"runtime/backend/sockmem.go:ChargeSocketMemory:os.Stat":          "host-only: a cgroup v1 memory controller's directory",
	"runtime/runc/backend.go:Backend.Prepare:os.RemoveAll":           runcDir,
	"runtime/runc/backend.go:New:os.MkdirAll":                        runcDir,
	"runtime/runc/backend.go:Prepared.holdMounts:unix.Open":          "the kernel's /proc/<pid>/ns/mnt of the container's init, this process's unwaited child",
	"runtime/runc/backend.go:destroy:os.RemoveAll":                   runcDir,
	"runtime/runc/live.go:innerPid:os.Open":                          procSys,
	"runtime/runc/cleanup.go:Backend.Cleanup:os.RemoveAll":           runcDir,
	"runtime/runc/seccomp.go:readProgram:os.Open":                    "host-only: this process's /proc/self/mem",
	"runtime/runc/seccomp.go:sealedFile:os.Open":                     "host-only: this process's /proc/self/fd, a memfd it made",
	"runtime/runsc/backend.go:Backend.Prepare:os.Mkdir":              runscDir,
	"runtime/runsc/backend.go:Backend.cleanup:os.RemoveAll":          runscDir,
	"runtime/runsc/backend.go:Backend.stateFiles:os.ReadDir":         runscDir,
	"runtime/runsc/backend.go:New:os.MkdirAll":                       runscDir,
	"runtime/runsc/backend.go:New:os.Stat":                           "host-only: the runsc binary the config names",
	"runtime/runsc/backend.go:openSandbox:os.ReadFile":               runscDir,
	"runtime/runsc/live.go:prepared.DialPort:os.Mkdir":               runscDir,
	"runtime/runsc/live.go:prepared.DialPort:os.RemoveAll":           runscDir,
	"runtime/runsc/live.go:newPTY:os.OpenFile":                       "host-only: the host's /dev/ptmx, a process's terminal made on the host",
	"runtime/runsc/live.go:prepared.Spawn:os.Mkdir":                  runscDir,
	"runtime/runsc/live.go:prepared.Spawn:os.RemoveAll":              runscDir,
	"runtime/runsc/live.go:prepared.Spawn:os.WriteFile":              runscDir,
	"runtime/runsc/live.go:readPid:os.ReadFile":                      runscDir,
	"runtime/runsc/backend.go:runscError:os.Open":                    runscDir,
	"runtime/runsc/backend.go:withChildren:filepath.Glob":            procSys,
	"runtime/runsc/backend.go:withChildren:os.ReadFile":              procSys,
	"runtime/runsc/backend.go:writeConfig:os.WriteFile":              runscDir,
}

// TestPathCallsGoThroughSafefs lists every call of scanned that resolves a
// path by name and fails on one not in allowed: a new way into a
// sandbox's tree must go through safefs, or be a justified entry.
func TestPathCallsGoThroughSafefs(t *testing.T) {
	root := moduleRoot(t)
	found := map[string]bool{}
	for _, dir := range scanned {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && d.Name() == "testdata" {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return nil
			}
			rel, _ := filepath.Rel(root, p)
			for _, k := range callSites(t, p, filepath.ToSlash(rel)) {
				found[k] = true
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	var missing []string
	for k := range found {
		if _, ok := allowed[k]; !ok {
			missing = append(missing, k)
		}
	}
	slices.Sort(missing)
	for _, k := range missing {
		t.Errorf("%s resolves a path by name: if the path can be inside anything a sandbox could write (a workspace, a session's disk, a display directory, a rootfs's upper layer), open it through internal/safefs; else add it to allowed in %s with the reason it cannot", k, "internal/safefs/callsites_test.go")
	}
	for k := range allowed {
		if !found[k] {
			t.Errorf("allowed lists %s, which is no longer there: remove the entry", k)
		}
	}
}

// callSites are the path calls in the Go file p (named rel), as
// rel:function:pkg.Call, the function being the declaration they are in.
func callSites(t *testing.T, p, rel string) []string {
	f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	// The file's names of the packages in pathCalls.
	names := map[string]string{}
	for _, imp := range f.Imports {
		ip, _ := strconv.Unquote(imp.Path.Value)
		if _, ok := pathCalls[ip]; !ok {
			continue
		}
		name := ip[strings.LastIndex(ip, "/")+1:]
		if imp.Name != nil {
			name = imp.Name.Name
		}
		names[name] = ip
	}
	var out []string
	for _, decl := range f.Decls {
		fn := "(top level)"
		if fd, ok := decl.(*ast.FuncDecl); ok {
			fn = fd.Name.Name
			if fd.Recv != nil && len(fd.Recv.List) > 0 {
				fn = recvName(fd.Recv.List[0].Type) + "." + fn
			}
		}
		// Every reference, called or not: os.Open passed as a value
		// opens as well.
		ast.Inspect(decl, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			id, ok := sel.X.(*ast.Ident)
			if !ok {
				return true
			}
			if ip, ok := names[id.Name]; ok && slices.Contains(pathCalls[ip], sel.Sel.Name) {
				out = append(out, fmt.Sprintf("%s:%s:%s.%s", rel, fn, id.Name, sel.Sel.Name))
			}
			return true
		})
	}
	return out
}

// recvName is a method's receiver type, without its star or type
// parameters.
func recvName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return recvName(x.X)
	case *ast.IndexExpr:
		return recvName(x.X)
	case *ast.IndexListExpr:
		return recvName(x.X)
	case *ast.Ident:
		return x.Name
	}
	return "?"
}

// moduleRoot is the directory of the module's go.mod, above this one.
func moduleRoot(t *testing.T) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}
