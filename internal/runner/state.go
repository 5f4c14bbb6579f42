package runner

import (
	"errors"
	"fmt"
	"io"

	"github.com/agentrun/agentrun/internal/launcher"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/session"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/internal/workspace"
	"github.com/agentrun/agentrun/runtime/spec"
)

// A run with keep_state restores and saves its state through the Python
// launcher (internal/launcher, state.go). The session's state is the
// host's copy (session.Lease.State), beside the session's disk, where no
// sandbox reaches: a stateful run gets that copy in its disk at
// launcher.StateFile before it starts (stateIn), and the state it leaves
// there replaces it only when the launcher's report says that it saved
// one and the file, opened without following a link, is a regular file
// within sessions.state_max_bytes by its size (keepState).

// stateIn puts the kept state of the session of lease into its disk,
// ws, at launcher.StateFile, for the launcher of a run of p with
// keep_state to restore; with reset_state it removes the session's state
// first. A session without a state gets none there: whatever a program
// left at launcher.StateFile is removed, never restored.
func stateIn(ws *workspace.Workspace, lease *session.Lease, p *task.Plan) error {
	if !p.KeepState && !p.ResetState {
		return nil
	}
	if p.ResetState {
		if err := lease.ResetState(); err != nil {
			return err
		}
	}
	rel := launcher.StateRel
	if ws.RemoveAll(rel) != nil {
		// Something of the program's in the way (a file or a link for
		// the directory): the directory is agentrun's.
		if err := ws.RemoveAll(launcher.StateRelDir); err != nil {
			return fmt.Errorf("removing the state from the session's disk: %w", err)
		}
	}
	if !p.KeepState || p.ResetState {
		return nil
	}
	f, err := lease.State()
	if err != nil || f == nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("reading the session's state: %w", err)
	}
	put := func() error {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return fmt.Errorf("reading the session's state: %w", err)
		}
		return ws.WriteFrom(rel, f, fi.Size(), spec.UID, spec.GID)
	}
	err = put()
	if err != nil && !errors.Is(err, workspace.ErrNoRoom) {
		// Something of the program's in the way of the state's
		// directory (a file, a link): the directory is agentrun's.
		if ws.RemoveAll(launcher.StateRelDir) == nil {
			err = put()
		}
	}
	if err != nil {
		return fmt.Errorf("putting the session's state in its disk: %w", err)
	}
	return nil
}

// keepState makes the state that the run in sb left in its session's
// disk the session's, where the launcher's report rep says that it saved
// one: once the file at launcher.StateFile, opened without following a
// link and without blocking, is a regular file of at most max bytes, by
// its size, and read whole without its size changing meanwhile (what the
// sandbox still runs may write). It returns what the result says of the
// state, and whether a state was kept.
func keepState(sb *sandbox, rep launcher.StateReport, max int64) (*result.State, bool) {
	st := rep.State
	if !st.Saved || rep.Unchanged || sb.lease == nil {
		return st, false
	}
	n, err := adoptState(sb.ws, sb.lease, max)
	if err != nil {
		st.Saved, st.Reason = false, fmt.Sprintf("the state was not kept (%v): the previous state stays", err)
		return st, false
	}
	st.Bytes = n
	return st, true
}

// adoptState copies launcher.StateFile of ws into the session's state,
// checked as keepState says, and returns its size.
func adoptState(ws *workspace.Workspace, lease *session.Lease, max int64) (int64, error) {
	f, err := ws.OpenRegular(launcher.StateRel)
	if err != nil {
		return 0, fmt.Errorf("the launcher's state file cannot be read: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	size := fi.Size()
	if size > max {
		return 0, fmt.Errorf("%d bytes, more than sessions.state_max_bytes (%d)", size, max)
	}
	w, err := lease.NewState()
	if err != nil {
		return 0, err
	}
	defer w.Abort()
	// At most size bytes are read, and size bytes must be there.
	if n, err := io.Copy(w, io.NewSectionReader(f, 0, size)); err != nil || n != size {
		return 0, fmt.Errorf("copying the state: %d bytes of %d (%v)", n, size, err)
	}
	if after, err := f.Stat(); err != nil || after.Size() != size || !after.ModTime().Equal(fi.ModTime()) {
		return 0, errors.New("the state file changed while it was copied")
	}
	if err := w.Commit(); err != nil {
		return 0, err
	}
	return size, nil
}
