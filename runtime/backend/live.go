package backend

import (
	"context"
	"net"
	"os"
)

// Live is a Prepared whose container runs more processes beside its
// program: a live sandbox's, whose program only holds it up. A backend's
// Prepared implements it when the backend can start a process inside a
// running container.
type Live interface {
	Prepared
	// Spawn starts p inside the container, once Exec has started the
	// program: in its namespaces and cgroup, as its user, with no
	// capabilities, no_new_privs and the container's seccomp filter,
	// exactly as the program runs.
	Spawn(p Process) (Spawned, error)
}

// Process is one process Spawn starts. Stdin, Stdout and Stderr are the
// child ends of its pipes (Pipes), which the caller closes once Spawn
// returns; with TTY they are nil, and the process's stdio is a
// pseudo-terminal made inside the container.
type Process struct {
	Args []string
	// Env is added to the container's own environment (later wins).
	Env []string
	// Cwd is its working directory inside the container; "" is the
	// container's.
	Cwd                   string
	Stdin, Stdout, Stderr *os.File
	// TTY, if set, gives the process a pseudo-terminal of that size as
	// its stdin, stdout and stderr, made by the container's own init
	// in the container's devpts; its master is Spawned.PTY.
	TTY *WinSize
}

// WinSize is a terminal's size.
type WinSize struct {
	Rows, Cols uint16
}

// Spawned is a process Spawn started.
type Spawned interface {
	// Pid is the process's pid inside the container's pid namespace.
	Pid() int
	// Signal sends sig to the process.
	Signal(sig os.Signal) error
	// Wait waits for the process to end; it may be called once.
	Wait() (*os.ProcessState, error)
	// PTY is the master of its pseudo-terminal (Process.TTY), nil
	// without one: non-blocking, the caller's to read, write, resize
	// and close.
	PTY() *os.File
}

// PortDialer is a Live that reaches the sandbox's own loopback itself,
// where the sandbox's network namespace is not where its sockets are
// (gVisor's netstack).
type PortDialer interface {
	// DialPort connects to TCP port on the sandbox's loopback.
	DialPort(ctx context.Context, port int) (net.Conn, error)
}
