package runc

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"

	"github.com/agentrun/agentrun/runtime/backend"
)

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
func (p *Prepared) Spawn(proc backend.Process) (backend.Spawned, error) {
	if len(proc.Args) == 0 {
		return nil, errors.New("spawn: no command")
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
	}
	if err := p.ctr.Run(lp); err != nil {
		return nil, fmt.Errorf("starting a process in sandbox %s: %w", p.ctr.ID(), err)
	}
	hostPid, err := lp.Pid()
	if err != nil {
		_ = lp.Signal(os.Kill)
		_, _ = lp.Wait()
		return nil, err
	}
	pid, err := innerPid(hostPid)
	if err != nil {
		_ = lp.Signal(os.Kill)
		_, _ = lp.Wait()
		return nil, err
	}
	return &spawned{proc: lp, pid: pid}, nil
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
}

func (s *spawned) Pid() int                        { return s.pid }
func (s *spawned) Signal(sig os.Signal) error      { return s.proc.Signal(sig) }
func (s *spawned) Wait() (*os.ProcessState, error) { return s.proc.Wait() }

var _ backend.Live = (*Prepared)(nil)
