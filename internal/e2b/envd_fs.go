package e2b

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/agentrun/agentrun/internal/e2b/envd/filesystem"
	"github.com/agentrun/agentrun/internal/e2b/envd/filesystem/filesystemconnect"
	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/runapi"
)

// maxFSMessage bounds a filesystem call's request message (a path or
// two, a watcher id).
const maxFSMessage = 64 << 10

// routeFilesystem adds envd's filesystem service (filesystem.Filesystem
// over Connect) and /files (upload and download) to mux, the envd mux:
// its handlers get their call with CallOf (see the package doc).
func (h *Handler) routeFilesystem(mux *http.ServeMux) {
	p, handler := filesystemconnect.NewFilesystemHandler(fsService{}, connect.WithReadMaxBytes(maxFSMessage))
	mux.Handle(p, handler)
	mux.HandleFunc("GET /files", h.download)
	mux.HandleFunc("POST /files", h.upload)
}

// fsService answers envd's filesystem service on a call's live sandbox,
// through its link-safe file methods (runapi.Sandbox): nothing runs in
// the sandbox.
type fsService struct{}

var _ filesystemconnect.FilesystemHandler = fsService{}

// sandboxOf is ctx's call's sandbox.
func sandboxOf(ctx context.Context) (runapi.Sandbox, error) {
	c := CallOf(ctx)
	if c == nil {
		return nil, connect.NewError(connect.CodeInternal, errors.New("not a call into a sandbox"))
	}
	return c.Sandbox, nil
}

// HomeDir is E2B's user's home as agentrun maps it: a relative path
// and "~" are in the sandbox's /workspace.
const HomeDir = "/workspace"

// sandboxPath is an E2B path as the sandbox's files take it: "~" and
// "~/…" are in HomeDir, a relative one too (the sandbox resolves it
// there); empty is HomeDir.
func sandboxPath(p string) string {
	switch {
	case p == "" || p == "~":
		return HomeDir
	case strings.HasPrefix(p, "~/"):
		return path.Join(HomeDir, p[2:])
	}
	return p
}

func (fsService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	sb, err := sandboxOf(ctx)
	if err != nil {
		return nil, err
	}
	fi, err := sb.Stat(sandboxPath(req.Msg.GetPath()))
	if err != nil {
		return nil, fsError(req.Msg.GetPath(), err)
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: entryOf(fi)}), nil
}

func (fsService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	sb, err := sandboxOf(ctx)
	if err != nil {
		return nil, err
	}
	name := sandboxPath(req.Msg.GetPath())
	created, err := sb.MakeDir(name)
	if err != nil {
		return nil, fsError(req.Msg.GetPath(), err)
	}
	if !created {
		// The SDK's makeDir answers false for this code.
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory %q already exists", req.Msg.GetPath()))
	}
	fi, err := sb.Stat(name)
	if err != nil {
		return nil, fsError(req.Msg.GetPath(), err)
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: entryOf(fi)}), nil
}

func (fsService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	sb, err := sandboxOf(ctx)
	if err != nil {
		return nil, err
	}
	to := sandboxPath(req.Msg.GetDestination())
	if err := sb.Rename(sandboxPath(req.Msg.GetSource()), to); err != nil {
		return nil, fsError(req.Msg.GetSource(), err)
	}
	fi, err := sb.Stat(to)
	if err != nil {
		return nil, fsError(req.Msg.GetDestination(), err)
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: entryOf(fi)}), nil
}

func (fsService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	sb, err := sandboxOf(ctx)
	if err != nil {
		return nil, err
	}
	depth := max(int(min(req.Msg.GetDepth(), 1<<16)), 1)
	name := sandboxPath(req.Msg.GetPath())
	fi, err := sb.Stat(name)
	if err != nil {
		return nil, fsError(req.Msg.GetPath(), err)
	}
	if fi.Type != "dir" {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%q is not a directory", req.Msg.GetPath()))
	}
	files, err := sb.ListDepth(name, depth)
	if err != nil {
		return nil, fsError(req.Msg.GetPath(), err)
	}
	out := &filesystem.ListDirResponse{Entries: make([]*filesystem.EntryInfo, 0, len(files))}
	for _, f := range files {
		out.Entries = append(out.Entries, entryOf(f))
	}
	return connect.NewResponse(out), nil
}

func (fsService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	sb, err := sandboxOf(ctx)
	if err != nil {
		return nil, err
	}
	if err := sb.Remove(sandboxPath(req.Msg.GetPath())); err != nil {
		return nil, fsError(req.Msg.GetPath(), err)
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

// entryOf is f as envd describes an entry. Its owner is E2B's "user"
// when it is the sandbox's uid (every process's), "root" for 0, else
// the number.
func entryOf(f runapi.FileInfo) *filesystem.EntryInfo {
	mode, _ := strconv.ParseUint(f.Mode, 8, 32)
	e := &filesystem.EntryInfo{Name: f.Name, Path: f.Path, Size: f.Size, Mode: uint32(mode),
		Owner: ownerName(f.UID), Group: ownerName(f.GID), ModifiedTime: timestamppb.New(f.MTime)}
	perm := fs.FileMode(mode)
	switch f.Type {
	case "file":
		e.Type = filesystem.FileType_FILE_TYPE_FILE
	case "dir":
		e.Type = filesystem.FileType_FILE_TYPE_DIRECTORY
		perm |= fs.ModeDir
	case "symlink":
		e.Type = filesystem.FileType_FILE_TYPE_SYMLINK
		perm |= fs.ModeSymlink
		e.SymlinkTarget = &f.Target
	}
	e.Permissions = perm.String()
	return e
}

// ownerName is id as E2B names an owner: the sandbox's own uid (a host
// uid of run_uids, which are 65536 and up) is E2B's "user", 0 "root",
// another its number.
func ownerName(id int) string {
	switch {
	case id == 0:
		return "root"
	case id >= 1000:
		return "user"
	}
	return strconv.Itoa(id)
}

// fsError is err, of a call on the E2B path name, as a Connect error
// with the code the SDK maps: NotFound (its FileNotFoundError),
// InvalidArgument, ResourceExhausted (no room), Internal for the rest.
// Its message never names a host path (the sandbox's errors do not).
func fsError(name string, err error) error {
	code := connect.CodeInternal
	switch {
	case errors.Is(err, fs.ErrNotExist):
		code = connect.CodeNotFound
	case errkind.Of(err) == errkind.Invalid:
		code = connect.CodeInvalidArgument
	case errkind.Of(err) == errkind.TooLarge:
		code = connect.CodeResourceExhausted
	case errkind.Of(err) == errkind.NotFound:
		code = connect.CodeUnavailable // the sandbox ended
	case errors.Is(err, fs.ErrExist):
		code = connect.CodeAlreadyExists
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.EISDIR),
		errors.Is(err, unix.ENOTEMPTY), errors.Is(err, unix.EXDEV), errors.Is(err, fs.ErrInvalid):
		code = connect.CodeInvalidArgument
	}
	return connect.NewError(code, fmt.Errorf("%s: %w%s", name, err, homeHint(name)))
}

// homeHint says, of a path in E2B's home (/home/user) or another
// /home, where the home is on agentrun.
func homeHint(name string) string {
	if name == "/home" || strings.HasPrefix(name, "/home/") {
		return " (E2B's home, /home/user, is " + HomeDir + " on agentrun: give a path relative to it, or in " + HomeDir + " or /tmp)"
	}
	return ""
}

// keepaliveEvery is how often a watch stream says it lives when nothing
// happens: the SDK's Keepalive-Ping-Interval (seconds), within bounds.
func keepaliveEvery(r http.Header) time.Duration {
	n, err := strconv.Atoi(r.Get("Keepalive-Ping-Interval"))
	if err != nil {
		return 30 * time.Second
	}
	return time.Duration(min(max(n, 5), 300)) * time.Second
}
