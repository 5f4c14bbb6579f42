package session

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// A session's kept state (keep_state) is the program's bytes, which
// agentrun never reads: the run launcher restores and saves it inside the
// sandbox. The state a run leaves in its disk becomes the session's only
// once the host has checked it (internal/runner: a clean save reported,
// its size within sessions.state_max_bytes), and it is then kept here, as
// the file state of the session's directory on the host, which no sandbox
// can reach: each stateful run gets a copy of it in its disk. A fork
// copies it with the disk, and removing the session removes it.
const (
	stateName = "state"
	// stateNewName is a state being written (StateWriter), renamed over
	// stateName by its Commit.
	stateNewName = "state.new"
)

// State opens the session's kept state to read; nil, with no error, when
// it has none.
func (l *Lease) State() (*os.File, error) {
	f, err := os.OpenFile(l.s.path(l.ID, stateName), os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("opening the session's state: %w", bare(err))
	}
	return f, nil
}

// ResetState removes the session's kept state, if it has one.
func (l *Lease) ResetState() error {
	if err := os.Remove(l.s.path(l.ID, stateName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing the session's state: %w", bare(err))
	}
	return nil
}

// StateWriter is a new kept state being written for a session, which
// becomes the session's at Commit; until then the previous one stays.
type StateWriter struct {
	f          *os.File
	path, dest string
}

// NewState starts a new kept state for the session (what a leftover of
// an earlier one that never committed held is dropped).
func (l *Lease) NewState() (*StateWriter, error) {
	path := l.s.path(l.ID, stateNewName)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("writing the session's state: %w", bare(err))
	}
	return &StateWriter{f: f, path: path, dest: l.s.path(l.ID, stateName)}, nil
}

// Write writes p at the end of the new state.
func (w *StateWriter) Write(p []byte) (int, error) { return w.f.Write(p) }

// Commit makes what was written the session's kept state, in place of the
// previous one (a rename: a crash leaves one or the other; SyncState puts
// it on the host's disk).
func (w *StateWriter) Commit() error {
	err := w.f.Close()
	w.f = nil
	if err == nil {
		err = os.Rename(w.path, w.dest)
	}
	if err != nil {
		os.Remove(w.path)
		return fmt.Errorf("keeping the session's state: %w", bare(err))
	}
	return nil
}

// Abort drops what was written: the previous state stays. After Commit
// it does nothing.
func (w *StateWriter) Abort() {
	if w.f != nil {
		w.f.Close()
		w.f = nil
		os.Remove(w.path)
	}
}

// SyncState writes the session's kept state, and its name, through to the
// host's disk (fsync of the file and of the session's directory): a run
// that committed one calls it once it has answered, as it syncs the disk.
func (l *Lease) SyncState() error {
	for _, p := range []string{l.s.path(l.ID, stateName), l.s.path(l.ID)} {
		f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("syncing the session's state: %w", bare(err))
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return fmt.Errorf("syncing the session's state: %w", bare(err))
		}
	}
	return nil
}

// bare is err without the host path that an *fs.PathError or an
// *os.LinkError names: what a door answers never names one.
func bare(err error) error {
	var pe *fs.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &pe):
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	case errors.As(err, &le):
		return fmt.Errorf("%s: %w", le.Op, le.Err)
	}
	return err
}
