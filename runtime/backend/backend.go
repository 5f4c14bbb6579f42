package backend

import (
	"context"
	"errors"
	"os"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/runtime/spec"
)

// Container is what a backend's Prepare sets up: a validated spec under
// its run's id. What the program gets when it runs (stdin, the timeout,
// the output cap) is Exec's Program.
type Container struct {
	// ID names the run (state dirs, cgroups); [a-z0-9-] only.
	ID string
	// Spec is the composed spec; Validate must already have accepted it.
	Spec *specs.Spec
	// Handover, if not nil, makes the container warm (a backend whose
	// Traits say Warm): Prepare starts its program at once, as the
	// Handover's argv, with its end of the channel; the caller waits for
	// its Ready; and Exec hands over through it instead of letting the
	// program start. Prepare takes it: the Prepared closes it.
	Handover *Handover
	// Ahead says that the container is prepared ahead of its run (a
	// pooled one): a backend may take the start of its program further
	// than a cold run's, up to just before the program's own exec, since
	// its run does not wait for that. Exec's work, and the program's, are
	// the same either way.
	Ahead bool
}

// Program is what a Prepared's Exec gives the program: its input, and the
// run's wall-clock and output bounds.
type Program struct {
	// Stdin is fed to the program, then its stdin is closed.
	Stdin []byte
	// Timeout bounds the program's wall-clock time; the whole sandbox is
	// killed then.
	Timeout time.Duration
	// OutputLimit caps the bytes kept of stdout and of stderr, each.
	OutputLimit int64
	// Output, if not nil, gets the kept output as it arrives.
	Output OutputFunc
}

// Outcome is what a finished run produced.
type Outcome struct {
	ExitCode   int
	Signal     string // name of the signal that ended the program, if any
	TimedOut   bool
	OOMKilled  bool
	Stdout     Output
	Stderr     Output
	Duration   time.Duration // from start to exit
	CPU        time.Duration
	MemoryPeak int64
}

// Backend runs containers, in two steps: Prepare sets a container up as far
// as the backend can ahead of its program, and the Prepared's Exec runs the
// program. The caller never needs to know which backend it holds: what
// differs between them for the set-up around a container is in Traits.
type Backend interface {
	// Traits is what the set-up of a run for this backend must know.
	Traits() Traits
	// Prepare sets up c's container up to the start of its program,
	// stopping once ctx is done (with an error that wraps ctx's). On
	// error nothing is left behind; otherwise the Prepared's Destroy
	// removes everything, run or not.
	Prepare(ctx context.Context, c *Container) (Prepared, error)
	Leftovers
}

// Leftovers finds and removes what a backend's runs left on the host when
// the agentrun that made them died. A host can need it for a runtime it
// can no longer run (runsc uninstalled, its config changed), so a backend
// may offer it apart.
type Leftovers interface {
	// IDs lists the runs the backend has state for on the host, live or
	// left behind by an agentrun that died.
	IDs() ([]string, error)
	// Cleanup removes run id, left behind by an agentrun that died: its
	// processes, cgroup and state. It is not an error if it is gone.
	Cleanup(id string) error
	// RemoveCgroupParent removes the cgroup that holds the backend's runs'
	// cgroups where it is empty and no run's cgroup is being made in it.
	// Runs keep it once made (agentrun's own, as its helpers' copies are):
	// `agentrun gc` removes it.
	RemoveCgroupParent() error
}

// Runtime is a runtime, by the name a task gives it (config.Runtime*), as
// the host has it: its Backend, or, when the host cannot run it, why not
// (Missing) and what still removes the runs that an agentrun which could
// left behind (Leftovers). internal/compose makes the host's and hands
// them to the runner, which picks none itself.
type Runtime struct {
	Name string
	// Backend runs the runtime's containers; nil when the host cannot.
	Backend Backend
	// Missing says why Backend is nil.
	Missing error
	// Leftovers cleans up after the runtime's runs when Backend is nil
	// (Backend does it otherwise); nil when nothing can.
	Leftovers Leftovers
}

// Prepared is a container set up by Prepare, whose program has not run.
type Prepared interface {
	// Exec starts the program, feeds it prog's stdin and waits for it to
	// end or for prog's timeout (or ctx) to kill the sandbox. It returns
	// an error only when the program could not be run or observed
	// (wrapping ErrNotStarted when it never started); the program's own
	// failure is in the Outcome. It may be called once.
	Exec(ctx context.Context, prog Program) (*Outcome, error)
	// Ready reports whether Exec can still start the program: it was not
	// run, and what waits for it is still there.
	Ready() bool
	// Destroy removes everything Prepare and Exec made; it may be called
	// once, after Exec or instead of it.
	Destroy() error
}

// Traits is what differs between backends for the set-up around a
// container.
type Traits struct {
	// CgroupParent is the cgroup under which the backend's runs have
	// theirs (each backend's apart, with its own gc and lock).
	CgroupParent string
	// PrivateRootfs: the backend writes to the root filesystem it is given
	// (gVisor's gofer makes the mount points itself), so each run needs a
	// private, writable view of the shared image rootfs.
	PrivateRootfs bool
	// Poolable: a prepared container may wait, set up, for a later run.
	Poolable bool
	// Warm: a prepared container's program can be started ahead, under
	// all of the sandbox's restrictions, and take its run through a
	// Handover (Container.Handover).
	Warm bool
	// SocketOutputs: a program's stdout and stderr, and those of a
	// process started in a live sandbox, must be stream sockets, not
	// pipes (Pipes.SocketOutputs).
	SocketOutputs bool
	// Spec, if not nil, is the backend's own change to the spec.
	Spec spec.SpecOpt
}

// ErrNotStarted is wrapped by a Prepared's Exec error when the program could
// not be started at all (what waited for it was gone).
var ErrNotStarted = errors.New("program not started")

// KilledAtDeadline reports whether o, whose timeout fired, is the outcome
// of the kill. A program that ended by itself as the deadline came (the
// kill found it gone) keeps its own outcome, and is not reported as timed
// out with a clean exit.
func KilledAtDeadline(o *Outcome) bool {
	return o.Signal == "SIGKILL"
}

// ExitSignal is the name of signal n when an exit status is 128+n, as
// the sandbox's init (and runsc) report a program that a signal ended;
// "" for other statuses. A program that exits with 128+n itself reads the
// same, as in a shell.
func ExitSignal(status int) string {
	if n := status - 128; n > 0 && n < 65 {
		return unix.SignalName(syscall.Signal(n))
	}
	return ""
}

// Watch waits for the program, whose end waited reports, until it ends, the
// timeout passes or ctx is done; in the two latter cases it calls kill,
// which must end the whole sandbox and return once waited has reported.
// It returns the program's state (as waited or kill gave it) and whether
// the timeout fired. S is whatever tells the program's end: its
// *os.ProcessState where the backend waits for the process itself, an
// exit status where it asks for one.
func Watch[S any](ctx context.Context, timeout time.Duration, waited <-chan S, kill func() S) (ps S, timedOut bool) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case ps = <-waited:
	case <-timer.C:
		timedOut = true
		ps = kill()
	case <-ctx.Done():
		ps = kill()
	}
	return ps, timedOut
}

// SetStatus sets o's ExitCode and Signal from an exit status as runsc
// reports one (128+n for a program that signal n ended), and TimedOut as
// SetExit does.
func (o *Outcome) SetStatus(status int, timedOut bool) {
	o.ExitCode, o.Signal = status, ExitSignal(status)
	o.TimedOut = timedOut && KilledAtDeadline(o)
}

// SetExit decodes the exit status ps (nil: none) into o's ExitCode and
// Signal, and sets TimedOut when the timeout fired and o is the outcome of
// the kill (KilledAtDeadline). A process a signal ended reads as 128+n, as
// does one whose exit status the sandbox's init (or runsc) reports so.
func (o *Outcome) SetExit(ps *os.ProcessState, timedOut bool) {
	if ps != nil {
		ws := ps.Sys().(syscall.WaitStatus)
		switch {
		case ws.Signaled():
			o.ExitCode = 128 + int(ws.Signal())
			o.Signal = unix.SignalName(ws.Signal())
		default:
			o.ExitCode = ws.ExitStatus()
			o.Signal = ExitSignal(o.ExitCode)
		}
	}
	o.TimedOut = timedOut && KilledAtDeadline(o)
}
