package backend

import (
	"context"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Container is one run as a backend sees it: a validated spec plus the
// program's input and the run's wall-clock and output bounds.
type Container struct {
	// ID names the run (state dirs, cgroups); [a-z0-9-] only.
	ID string
	// Spec is the composed spec; Validate must already have accepted it.
	Spec *specs.Spec
	// Stdin is fed to the program, then its stdin is closed.
	Stdin []byte
	// Timeout bounds the run's wall-clock time; the whole sandbox is killed then.
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

// Backend runs containers. Run returns an error only when the program could
// not be run or observed; the program's own failure is in the Outcome. Run
// removes everything it created before it returns, on every path.
type Backend interface {
	Run(ctx context.Context, c *Container) (*Outcome, error)
}

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
