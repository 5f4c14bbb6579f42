package runc

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/utils"

	"github.com/agentrun/agentrun/runtime/backend"
)

// startedWait bounds Spawn's wait for the sandbox's program to start:
// milliseconds, seconds on a busy host.
const startedWait = 30 * time.Second

// spawnBase is what a process Spawn starts shares with the container's
// program: its environment, working directory, user, rlimits, and the
// compiled seccomp filter that the helper loads (nil: libcontainer's
// setns init loads the container's own, as for `runc exec`).
type spawnBase struct {
	env     []string
	cwd     string
	uid     int
	gid     int
	rlimits []configs.Rlimit
	filter  *os.File // shared, never closed here
}

// Spawn starts p in the running container, as `runc exec` does: its
// process joins the container's namespaces and cgroup, as the container's
// user, with no capabilities (the container's empty sets), no_new_privs
// and its rlimits. The filter: where the helper loads the container's
// (Prepare), the process is the helper, which loads the same program
// before anything of p runs and execs p's argv[0] in its place (an argv[0]
// without a slash is looked up in PATH by the image's /bin/sh, as `exec`;
// its words are arguments, never a shell line); otherwise libcontainer's
// setns init loads the container's filter itself.
//
// With proc.TTY, its stdio is a pseudo-terminal that the container's init
// makes in the container's own devpts (/dev/pts, newinstance) before it
// executes the process, as `runc exec -t` has it: the init sends its
// master back over a socket pair, and the process's stdio is the other
// end, its controlling terminal.
func (p *Prepared) Spawn(proc backend.Process) (backend.Spawned, error) {
	if len(proc.Args) == 0 {
		return nil, errors.New("spawn: no command")
	}
	// Never beside an init that has not executed the program yet (the
	// holder's Exec runs beside the sandbox's first requests).
	select {
	case <-p.started:
	case <-time.After(startedWait):
		return nil, errors.New("spawn: the sandbox's program has not started")
	}
	if p.startErr != nil {
		return nil, fmt.Errorf("spawn: the sandbox's program did not start: %w", p.startErr)
	}
	b := p.spawn
	args := proc.Args
	var extra []*os.File
	if b.filter != nil {
		if !strings.Contains(args[0], "/") {
			args = append([]string{"/bin/sh", "-c", `exec "$@"`, "sh"}, args...)
		}
		args = append([]string{seccompHelperPath}, args...)
		extra = []*os.File{b.filter}
	}
	cwd := b.cwd
	if proc.Cwd != "" {
		cwd = proc.Cwd
	}
	nnp := true
	lp := &libcontainer.Process{
		Args:            args,
		ExtraFiles:      extra,
		Env:             append(append([]string{}, b.env...), proc.Env...),
		Cwd:             cwd,
		UID:             b.uid,
		GID:             b.gid,
		Stdin:           proc.Stdin,
		Stdout:          proc.Stdout,
		Stderr:          proc.Stderr,
		NoNewPrivileges: &nnp,
		Rlimits:         b.rlimits,
		LogLevel:        logLevel(),
	}
	var sock *os.File // our end of the console socket
	if proc.TTY != nil {
		parent, child, err := utils.NewSockPair("console")
		if err != nil {
			return nil, fmt.Errorf("spawn: a console socket: %w", err)
		}
		defer child.Close()
		defer parent.Close()
		sock = parent
		lp.Stdin, lp.Stdout, lp.Stderr = nil, nil, nil
		lp.ConsoleSocket = child
		lp.ConsoleWidth, lp.ConsoleHeight = proc.TTY.Cols, proc.TTY.Rows
	}
	if err := p.ctr.Run(lp); err != nil {
		return nil, fmt.Errorf("starting a process in sandbox %s: %w", p.ctr.ID(), err)
	}
	kill := func(err error) (backend.Spawned, error) {
		_ = lp.Signal(os.Kill)
		_, _ = lp.Wait()
		return nil, err
	}
	var pty *os.File
	if sock != nil {
		// The init sent the master before it executed the process, or
		// died: with the child end closed here, the receive ends.
		_ = lp.ConsoleSocket.Close()
		var err error
		if pty, err = recvPTY(sock); err != nil {
			return kill(fmt.Errorf("the pseudo-terminal of a process in sandbox %s: %w", p.ctr.ID(), err))
		}
	}
	hostPid, err := lp.Pid()
	if err == nil {
		var pid int
		if pid, err = innerPid(hostPid); err == nil {
			return &spawned{proc: lp, pid: pid, pty: pty}, nil
		}
	}
	if pty != nil {
		pty.Close()
	}
	return kill(err)
}

// recvPTY receives the master of a pseudo-terminal from the container's
// init over sock and checks that it is one (backend.PTYMaster).
func recvPTY(sock *os.File) (*os.File, error) {
	//lint:ignore SA1019 libcontainer's own receiver of its console socket (moved to runc's internal/cmsg)
	f, err := utils.RecvFile(sock)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return backend.PTYMaster(f)
}

// innerPid reads the pid, in its innermost pid namespace, of host
// process pid, this process's child not yet waited for (the host
// kernel's /proc, which nothing in a sandbox writes).
func innerPid(pid int) (int, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("reading the sandbox pid of %d: %w", pid, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "NSpid:"); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				break
			}
			return strconv.Atoi(f[len(f)-1])
		}
	}
	return 0, fmt.Errorf("no NSpid in /proc/%d/status", pid)
}

type spawned struct {
	proc *libcontainer.Process
	pid  int
	pty  *os.File
}

func (s *spawned) Pid() int                        { return s.pid }
func (s *spawned) Signal(sig os.Signal) error      { return s.proc.Signal(sig) }
func (s *spawned) Wait() (*os.ProcessState, error) { return s.proc.Wait() }
func (s *spawned) PTY() *os.File                   { return s.pty }

var _ backend.Live = (*Prepared)(nil)
