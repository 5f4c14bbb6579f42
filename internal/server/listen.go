package server

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/coreos/go-systemd/v22/activation"

	"github.com/agentrun/agentrun/internal/config"
)

// socketGroup is the group given access to the unix socket when it exists.
const socketGroup = "agentrun"

// noToken is the refusal of a TCP socket without server.token, after
// where the socket comes from.
const noToken = "set server.token, which every request must then carry as a bearer token"

// socketDir makes the directory of a unix server.listen when it is
// missing: 0750, root and the agentrun group (when there is one), so that
// the group can reach the socket and nothing else. The state dir, private
// to root, must not hold it. An existing directory is left as it is, with
// a warning when the group cannot pass through it.
func socketDir(addr config.Addr, stateDir string, logf func(string, ...any)) error {
	if addr.Network != "unix" {
		return nil
	}
	dir := filepath.Dir(addr.Address)
	if rel, err := filepath.Rel(filepath.Clean(stateDir), dir); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
		return fmt.Errorf("server.listen %s is inside state_dir %s, which only root may enter: put the socket elsewhere (the default is %s)",
			addr, stateDir, config.Default().Server.Listen)
	}
	gid := -1
	if g, err := user.LookupGroup(socketGroup); err == nil {
		if n, err := strconv.Atoi(g.Gid); err == nil {
			gid = n
		}
	}
	st, err := os.Stat(dir)
	if err == nil {
		if gid >= 0 && st.Mode().Perm()&0o011 == 0 {
			logf("warning: %s (mode %v) does not let group %s reach the socket", dir, st.Mode().Perm(), socketGroup)
		}
		return nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("socket dir: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("creating socket dir: %w", err)
	}
	if err := os.Mkdir(dir, 0o750); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("creating socket dir: %w", err)
	}
	if gid >= 0 {
		if err := os.Chown(dir, 0, gid); err != nil {
			return fmt.Errorf("giving the socket dir to group %s: %w", socketGroup, err)
		}
	}
	// Mkdir's mode went through the umask.
	if err := os.Chmod(dir, 0o750); err != nil {
		return fmt.Errorf("setting the socket dir's mode: %w", err)
	}
	return nil
}

// listen opens the listener of server.listen. A unix socket is made
// 0660, for root and the agentrun group (when there is one); a stale
// socket file from a server that died is replaced, a live one is not.
func listen(addr config.Addr) (net.Listener, func(), error) {
	if addr.Network == "tcp" {
		ln, err := net.Listen("tcp", addr.Address)
		if err != nil {
			return nil, nil, fmt.Errorf("listening on %s: %w", addr, err)
		}
		return ln, func() {}, nil
	}
	path := addr.Address
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return nil, nil, fmt.Errorf("%s: another agentrun serve is listening there", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("removing stale socket: %w", err)
	}
	// A new socket is 0755 under the usual umask: only root can connect
	// until the chmod.
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		ln.Close()
		return nil, nil, fmt.Errorf("setting socket mode: %w", err)
	}
	if g, err := user.LookupGroup(socketGroup); err == nil {
		if gid, err := strconv.Atoi(g.Gid); err == nil {
			if err := os.Chown(path, 0, gid); err != nil {
				ln.Close()
				return nil, nil, fmt.Errorf("giving the socket to group %s: %w", socketGroup, err)
			}
		}
	}
	// The listener removes the socket file when closed.
	return ln, func() { ln.Close() }, nil
}

// listenerOf is the socket systemd passed (LISTEN_FDS, socket activation),
// or else a new one on server.listen. A passed socket is systemd's: it is
// not removed on exit. A passed TCP socket needs server.token like a
// configured one.
func listenerOf(cfg *config.Config, addr config.Addr) (net.Listener, func(), error) {
	lns, err := activation.Listeners()
	if err != nil {
		return nil, nil, fmt.Errorf("sockets from systemd: %w", err)
	}
	switch len(lns) {
	case 0:
		return listen(addr)
	case 1:
	default:
		for _, l := range lns {
			if l != nil {
				l.Close()
			}
		}
		return nil, nil, fmt.Errorf("systemd passed %d sockets; agentrun serve takes one", len(lns))
	}
	ln := lns[0]
	if ln == nil {
		return nil, nil, errors.New("the socket systemd passed is not a listening stream socket")
	}
	if cfg.Server.NeedsToken(ln.Addr().Network()) {
		ln.Close()
		return nil, nil, errors.New("systemd passed a TCP socket: " + noToken)
	}
	if ul, ok := ln.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(false)
	}
	return ln, func() { ln.Close() }, nil
}
