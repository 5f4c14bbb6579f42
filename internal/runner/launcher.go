package runner

import (
	"context"
	"errors"

	"github.com/agentrun/agentrun/image"
	"github.com/agentrun/agentrun/internal/cleanup"
	"github.com/agentrun/agentrun/internal/launcher"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/runtime/backend"
)

// MakeLauncherCode has the runner make the run launcher's bytecode for
// each image and interpreter its Python runs use, once, in a sandbox of
// its own (launcher.Codes). For a long-lived runner: a compile goes on
// after the run that asked for it.
func (r *Runner) MakeLauncherCode() { r.codes.Make() }

// MakeLauncherCodeAfter has a one-shot runner make the bytecode its
// Python runs missed, in MakeMissedLauncherCode, once their results are
// out (launcher.Codes.MakeAfter).
func (r *Runner) MakeLauncherCodeAfter() { r.codes.MakeAfter() }

// MakeMissedLauncherCode compiles the bytecode that the runner's runs
// missed since MakeLauncherCodeAfter, each in a sandbox of its own, and
// returns when they have ended or ctx is done.
func (r *Runner) MakeMissedLauncherCode(ctx context.Context) { r.codes.MakePending(ctx) }

// compileLauncher runs cp, the plan of the run launcher's compile
// (launcher.Codes), in img, in a sandbox of its own that gets the
// launcher's source alone, and returns its result.
func (r *Runner) compileLauncher(ctx context.Context, cp *task.Plan, img *image.Image) (*result.Result, error) {
	res := &result.Result{ID: newID(), Files: map[string]result.File{}}
	sb, err := r.setup(ctx, request{plan: cp, img: img, id: res.ID, res: res, compile: true})
	if err != nil {
		return nil, err
	}
	err = r.execute(ctx, cp, sb, res, runapi.Hooks{})
	if err = errors.Join(err, sb.settle.Clean(), sb.undo.Clean()); err != nil {
		return nil, err
	}
	return res, nil
}

// etcWriter writes into the etc tmpfs of run dir dir (writeEtc), which
// undo unmounts.
func etcWriter(dir string, undo *cleanup.Cleanup) launcher.WriteFunc {
	return func(name string, data []byte) (string, error) { return writeEtc(dir, undo, name, data) }
}

// launcher sets up agentrun's Python launcher (launcher.For) for a run of
// Python code, a warm sandbox and a compile of the launcher: its files,
// the display directory and a run's state request; its start, or a warm
// sandbox's launcher, becomes the program.
func (s *sandboxSetup) launcher() error {
	req := launcher.Request{Plan: s.req.plan, Image: s.req.img, Dir: s.dir, UID: s.sb.uid,
		Etc: etcWriter(s.dir, &s.sb.undo), Undo: &s.sb.undo, Codes: s.r.codes, Warm: s.req.warm, Compile: s.req.compile, Live: s.req.live}
	if !s.req.pooled {
		req.State = launcher.NewStateRequest(s.req.plan, s.r.cfg.Sessions.StateBytes())
	}
	set, err := launcher.For(req)
	if err != nil {
		return err
	}
	s.launchOpts = append(s.launchOpts, set.Opts...)
	s.sb.display = set.Display
	return nil
}

// warmLauncher gives a warm sandbox the handover on which its launcher
// says when it is ready.
func (s *sandboxSetup) warmLauncher() (err error) {
	if s.req.warm != nil {
		s.handover, err = backend.NewHandover("warm program")
	}
	return err
}
