package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/runner"
	"github.com/agentrun/agentrun/internal/server"
)

// configPath is the --config of serve's args ("" for the default), which
// loadConfig has already parsed.
func configPath(args []string) string {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	p := fs.String("config", "", "")
	_ = fs.Parse(args)
	return *p
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
	if _, ok := ln.Addr().(*net.TCPAddr); ok && cfg.Server.Token == "" {
		ln.Close()
		return nil, nil, errors.New("systemd passed a TCP socket: set server.token, which every request must then carry as a bearer token")
	}
	if ul, ok := ln.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(false)
	}
	return ln, func() { ln.Close() }, nil
}

// notify sends state to systemd's NOTIFY_SOCKET, when there is one.
func notify(state string) {
	_, _ = daemon.SdNotify(false, state)
}

// readyWait bounds how long serve waits for its pool before it tells
// systemd it is ready anyway (a pool that cannot fill is in /healthz).
const readyWait = 60 * time.Second

// notifyReady sends READY=1 once the pool holds sizes (or after readyWait).
func notifyReady(pool *runner.Pool, sizes map[string]int, logf func(string, ...any)) {
	deadline := time.Now().Add(readyWait)
	for !poolFull(pool.Stats(), sizes) {
		if time.Now().After(deadline) {
			logf("pool not filled after %v (%s): ready without it", readyWait, pool.Stats().LastErr)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	notify("READY=1")
}

func poolFull(st runapi.PoolStats, sizes map[string]int) bool {
	for ref, n := range sizes {
		if st.Ready[ref] < n {
			return false
		}
	}
	return true
}

// reload reads the config at path again and applies it to the runs that
// come next: task defaults, policy, languages, server quotas, queue,
// max_concurrent, token and pool sizes. A config that does not load, or
// that changes what only a restart can (the socket, directories, audit
// log, runsc, network), is refused and cur stays.
func reload(cur *config.Config, path string, api *server.Server, pool *runner.Pool) (*config.Config, error) {
	next, err := config.Load(path)
	if err != nil {
		return nil, err
	}
	var fixed []string
	for name, same := range map[string]bool{
		"server.listen":     next.Server.Listen == cur.Server.Listen,
		"state_dir":         next.StateDir == cur.StateDir,
		"store_dir":         next.StoreDir == cur.StoreDir,
		"store_max_size":    next.StoreMax == cur.StoreMax,
		"audit":             next.Audit == cur.Audit,
		"runsc":             reflect.DeepEqual(next.Runsc, cur.Runsc),
		"network":           reflect.DeepEqual(next.Network, cur.Network),
		"init":              next.Init == cur.Init,
		"sessions":          next.Sessions == cur.Sessions,
		"run_uids":          next.RunUIDs == cur.RunUIDs,
		"policy.registries": slices.Equal(next.Policy.Registries, cur.Policy.Registries),
	} {
		if !same {
			fixed = append(fixed, name)
		}
	}
	if len(fixed) > 0 {
		return nil, fmt.Errorf("%s changed, which takes a restart", strings.Join(fixed, ", "))
	}
	if next.Server.Listen.Network == "tcp" && next.Server.Token == "" {
		return nil, errors.New("server.listen is tcp: server.token may not be removed")
	}
	if err := checkWebhookSecret("server.approvals", next.Server.Approvals.WebhookSecretFile); err != nil {
		return nil, err
	}
	if _, err := poolSeeds(next); err != nil {
		return nil, err
	}
	api.Reload(next)
	pool.Resize(next.Server.PoolSizes())
	pool.SetWarm(next)
	failed, _ := seedPool(context.Background(), next, pool, func(string, ...any) {})
	if len(failed) > 0 {
		return next, fmt.Errorf("applied, but the pool cannot fill: %v", failed)
	}
	return next, nil
}
