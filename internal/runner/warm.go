package runner

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/launcher"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/runtime/spec"
)

// A warm sandbox is a pooled sandbox whose program, agentrun's warm
// launcher (internal/launcher's agentrun_warm.py), already runs: the
// language's interpreter, started under all of the sandbox's
// restrictions, with the configured modules imported, waiting for its one
// run on a hand-over channel (backend.Handover). The run that takes it
// writes its files and code into /workspace as any run does, and the
// hand-over lets the launcher run the code as __main__.
//
// A task runs warm when its image has warm settings that have not failed,
// its runtime's backend can start a program ahead (Traits.Warm: runsc
// cannot), it gives code in a language whose argv is the warm language's,
// and its env names no PYTHON* variable (they change how the interpreter
// starts, which has happened). Other tasks of the image are served as
// without warm settings. A run in a kept session takes one too: its
// session's disk is mounted on the sandbox's workspace at the take
// (Runner.adoptSession), and the launcher restores and saves its state as
// the run launcher does. Warm sandboxes that fail (a preload the image
// lacks, a launcher that dies or says anything but ready) make their image
// get plain sandboxes until the settings change; runapi.PoolStats.Warm says why.

// warmReadyWait bounds a warm sandbox's start and imports.
const warmReadyWait = 60 * time.Second

// warmSetting is one image's warm settings.
type warmSetting struct {
	cfg  config.Warm
	argv []string // the language's argv, with "{file}"
}

// warmError is a failure of a warm sandbox's launcher: the image's warm
// pool goes cold.
type warmError struct{ err error }

func (e *warmError) Error() string { return e.err.Error() }
func (e *warmError) Unwrap() error { return e.err }

// SetWarm takes cfg's warm settings of server.pool (at start, before Seed,
// and on a reload, before the new Seed). An image whose settings changed
// gets warm sandboxes again if they had failed.
func (p *Pool) SetWarm(cfg *config.Config) {
	p.mu.Lock()
	defer p.mu.Unlock()
	next := map[string]warmSetting{}
	for ref, w := range cfg.Server.PoolWarm() {
		next[ref] = warmSetting{cfg: w, argv: slices.Clone(cfg.Languages[w.Language])}
	}
	for ref, old := range p.warm {
		if n, ok := next[ref]; !ok || !slices.Equal(n.argv, old.argv) || !slices.Equal(n.cfg.Preload, old.cfg.Preload) {
			delete(p.cold, ref)
		}
	}
	p.warm = next
}

// warmFor is the launcher argv of a warm sandbox for plan, or nil when
// plan does not run warm. p.mu is held.
func (p *Pool) warmFor(plan *task.Plan) []string {
	w, ok := p.warm[plan.Image]
	if !ok || p.cold[plan.Image] != "" || plan.CodeFile == "" {
		return nil
	}
	if be := p.r.backends[plan.Runtime]; be == nil || !be.Traits().Warm {
		return nil
	}
	for k := range plan.Env {
		if strings.HasPrefix(k, "PYTHON") {
			return nil
		}
	}
	file := spec.WorkspaceDir + "/" + plan.CodeFile
	var argv []string
	for i, a := range w.argv {
		if i >= len(plan.Argv) || plan.Argv[i] != strings.ReplaceAll(a, "{file}", file) {
			return nil
		}
		if a == "{file}" {
			argv = append(argv, launcher.WarmArgs(w.cfg.Preload, file)...)
		} else {
			argv = append(argv, a)
		}
	}
	if len(plan.Argv) != len(w.argv) {
		return nil
	}
	return argv
}

// warmKey is the shape key of a sandbox of key's shape that is warm with
// launcher argv warm (key itself for a plain one).
func warmKey(key string, warm []string) string {
	if key == "" || warm == nil {
		return key
	}
	sum := sha256.Sum256([]byte(key + "\x00" + strings.Join(warm, "\x00")))
	return hex.EncodeToString(sum[:])
}

// goCold makes s's image get plain sandboxes from now on, because its
// warm ones fail with err. p.mu is held.
func (p *Pool) goCold(s *shape, err *warmError) {
	ref := s.plan.Image
	if _, ok := p.warm[ref]; !ok || p.closed {
		return
	}
	p.cold[ref] = err.Error()
	if p.shapes[ref] == s {
		p.keep(s.plan, s.img, shapeKey(s.plan, s.img), nil)
	}
}
