package task

import (
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/names"
)

// The names of a task are checked byte by byte (package names), not by
// regular expressions compiled at every start of the binary (which is also
// every container's init).

// IsKeptSessionID reports whether s is the form of a kept session's id:
// "ss-" and 32 lowercase hex digits (128 random bits).
func IsKeptSessionID(s string) bool {
	hex, ok := strings.CutPrefix(s, "ss-")
	if !ok || len(hex) != 32 {
		return false
	}
	for i := 0; i < len(hex); i++ {
		if c := hex[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// CheckID checks a task id: 1 to MaxIDLen characters of A-Z a-z 0-9 _ -,
// so that it is a valid key of the results bucket and a subject token.
func CheckID(id string) error {
	if id == "" || len(id) > MaxIDLen || !names.Only(id, "_-") {
		return fmt.Errorf("%q: must be 1 to %d characters of A-Z a-z 0-9 _ -", id, MaxIDLen)
	}
	return nil
}

// codeExt gives the code file's extension per language; others get none.
var codeExt = map[string]string{
	"python": ".py", "python3": ".py",
	"node": ".js", "nodejs": ".js", "javascript": ".js",
	"bash": ".sh", "sh": ".sh",
}

// CodeFileName is the workspace-relative name the code of a task in the given
// language is written to: main.py, main.js, main.sh, or "main".
func CodeFileName(language string) string { return "main" + codeExt[language] }

// Resolve validates t against cfg and fills in every default from it. A task
// problem is an *Error naming the field (wrapping errkind.ErrPolicy for policy
// refusals); a broken cfg gives a plain error.
func (t *Task) Resolve(cfg *config.Config) (*Plan, error) {
	if cfg == nil {
		return nil, errors.New("task: resolve: nil config")
	}
	p := &Plan{ID: t.ID, Session: t.Session, Image: t.Image, Runtime: t.Runtime,
		KeepWorkspace: t.KeepWorkspace || t.KeepState || t.ResetState, KeepState: t.KeepState, ResetState: t.ResetState}
	if t.ID != "" {
		if err := CheckID(t.ID); err != nil {
			return nil, errorf("id", "%v", err)
		}
	}
	if len(p.Session) > MaxSessionLen || !names.Only(p.Session, "._:-") {
		return nil, errorf("session", "must be at most %d characters of A-Z a-z 0-9 . _ : -", MaxSessionLen)
	}
	if (p.KeepState || p.ResetState) && !IsKeptSessionID(p.Session) {
		field := "keep_state"
		if !p.KeepState {
			field = "reset_state"
		}
		return nil, errorf(field, "needs the id of a session made by `agentrun sessions new` (ss- and 32 hex digits) in session, not %q", p.Session)
	}
	if p.KeepWorkspace && !IsKeptSessionID(p.Session) {
		// Only ids that agentrun sessions new made have a kept workspace;
		// whether this one exists is checked when the run takes it.
		return nil, errorf("keep_workspace", "needs the id of a session made by `agentrun sessions new` (ss- and 32 hex digits) in session, not %q", p.Session)
	}
	if p.Image == "" {
		p.Image = cfg.Image
	} else if err := config.CheckLocalImage(p.Image, cfg.Policy.LocalImages); err != nil {
		// A task naming a host path could make any host directory its
		// root: only the directories the operator lists may be named.
		return nil, &Error{Field: "image", Reason: err.Error(), Err: errkind.ErrPolicy}
	}
	if err := config.CheckImage(p.Image); err != nil {
		return nil, errorf("image", "%v", err)
	}
	if p.Runtime == "" {
		p.Runtime = cfg.Runtime
	}
	if err := config.CheckRuntime(p.Runtime); err != nil {
		return nil, errorf("runtime", "%v", err)
	}
	if err := t.resolveProgram(p, cfg); err != nil {
		return nil, err
	}
	if p.KeepState && !IsPython(p) {
		return nil, errorf("keep_state", "a state is kept for Python code only (code in a language whose interpreter is python)")
	}
	lim, err := resolveLimits(t.Limits, cfg)
	if err != nil {
		return nil, err
	}
	p.Limits = lim
	if err := t.resolveFiles(p); err != nil {
		return nil, err
	}
	if p.Collect, err = checkCollect(t.Collect); err != nil {
		return nil, err
	}
	if p.Env, err = mergeEnv(cfg.Env, t.Env); err != nil {
		return nil, err
	}
	if p.Allow, err = checkAllow(t.Network.Allow, cfg.Policy.AllowNetwork); err != nil {
		return nil, err
	}
	if p.Services, err = checkServices(t.Network.Services, cfg); err != nil {
		return nil, err
	}
	if p.Tools, err = checkTools(t.Tools, cfg); err != nil {
		return nil, err
	}
	if len(p.Tools) > 0 {
		p.ToolServers = make(config.Tools, len(p.Tools))
		for _, name := range p.Tools {
			p.ToolServers[name] = cfg.Tools[name]
		}
		p.ToolLimits = cfg.ToolLimits
	}
	_, pooled := cfg.Server.Pool[p.Image]
	p.OwnImage = p.Image == cfg.Image || pooled
	return p, nil
}

// resolveProgram fills Argv, CodeFile, Code and Stdin.
func (t *Task) resolveProgram(p *Plan, cfg *config.Config) error {
	switch {
	case t.Code == "" && len(t.Command) == 0:
		return errorf("code", "one of code or command is required")
	case t.Code != "" && len(t.Command) > 0:
		return errorf("command", "code and command are mutually exclusive; give one")
	case len(t.Command) > 0:
		for i, a := range t.Command {
			if a == "" || strings.ContainsRune(a, 0) {
				return errorf(fmt.Sprintf("command[%d]", i), "must be non-empty and contain no NUL")
			}
		}
		p.Argv = slices.Clone(t.Command)
	default:
		lang := t.Language
		if lang == "" {
			lang = cfg.Language
		}
		argv := cfg.Languages[lang]
		if len(argv) == 0 {
			return errorf("language", "unknown language %q (known: %s)", lang, strings.Join(config.LanguageNames(cfg), ", "))
		}
		p.CodeFile = CodeFileName(lang)
		p.Code = []byte(t.Code)
		for _, a := range argv {
			p.Argv = append(p.Argv, strings.ReplaceAll(a, "{file}", "/workspace/"+p.CodeFile))
		}
	}
	if t.Stdin != "" {
		p.Stdin = []byte(t.Stdin)
	}
	return nil
}

// resolveFiles checks and decodes files, and checks that they, the code and
// stdin fit the workspace.
func (t *Task) resolveFiles(p *Plan) error {
	if len(t.Files) > MaxFiles {
		return errorf("files", "%d files, more than the maximum %d", len(t.Files), MaxFiles)
	}
	p.Files = make(map[string][]byte, len(t.Files))
	names := slices.Sorted(maps.Keys(t.Files))
	total := int64(len(p.Code)) + int64(len(p.Stdin))
	for _, name := range names {
		field := fmt.Sprintf("files[%q]", name)
		if reason := checkRelPath(name); reason != "" {
			return errorf(field, "%s", reason)
		}
		if name == p.CodeFile {
			return errorf(field, "collides with the code file %s", p.CodeFile)
		}
		f := t.Files[name]
		var data []byte
		switch {
		case (f.Content == nil) == (f.ContentBase64 == nil):
			return errorf(field, "exactly one of content or content_base64 is required")
		case f.Content != nil:
			data = []byte(*f.Content)
		default:
			var err error
			if data, err = base64.StdEncoding.DecodeString(*f.ContentBase64); err != nil {
				return errorf(field+".content_base64", "invalid base64: %v", err)
			}
		}
		p.Files[name] = data
		total += int64(len(data))
	}
	// A name may not be both a file and a directory of another file.
	for _, name := range names {
		for i := range len(name) {
			if name[i] != '/' {
				continue
			}
			dir := name[:i]
			if _, ok := p.Files[dir]; ok || dir == p.CodeFile {
				return errorf(fmt.Sprintf("files[%q]", name), "%s is a file, so it cannot also be a directory", dir)
			}
		}
	}
	if total > p.Limits.WorkspaceSize {
		return errorf("limits.workspace_size", "files, code and stdin total %d bytes, more than the workspace size %d bytes", total, p.Limits.WorkspaceSize)
	}
	return nil
}

// checkRelPath returns why name is not a clean relative path inside the
// workspace, or "" if it is.
func checkRelPath(name string) string {
	switch {
	case name == "":
		return "must not be empty"
	case len(name) > MaxPathLen:
		return fmt.Sprintf("longer than %d bytes", MaxPathLen)
	case strings.ContainsRune(name, 0):
		return "contains NUL"
	case strings.HasPrefix(name, "/"):
		return "must be relative to /workspace, not absolute"
	}
	for elem := range strings.SplitSeq(name, "/") {
		switch {
		case elem == "":
			return "has an empty path component (\"//\" or a trailing \"/\")"
		case elem == "." || elem == "..":
			return fmt.Sprintf("must not contain a %q component", elem)
		case len(elem) > MaxPathElemLen:
			return fmt.Sprintf("has a component longer than %d bytes", MaxPathElemLen)
		}
	}
	return ""
}

func checkCollect(globs []string) ([]string, error) {
	if len(globs) > MaxCollect {
		return nil, errorf("collect", "%d entries, more than the maximum %d", len(globs), MaxCollect)
	}
	for i, g := range globs {
		field := fmt.Sprintf("collect[%d]", i)
		if reason := checkRelPath(g); reason != "" {
			return nil, errorf(field, "%s", reason)
		}
		if _, err := path.Match(g, ""); err != nil {
			return nil, errorf(field, "invalid glob %q: %v", g, err)
		}
	}
	return slices.Clone(globs), nil
}

func mergeEnv(base, task map[string]string) (map[string]string, error) {
	env := maps.Clone(base)
	if env == nil {
		env = map[string]string{}
	}
	for _, name := range slices.Sorted(maps.Keys(task)) {
		if err := config.CheckEnv(name, task[name]); err != nil {
			return nil, errorf(fmt.Sprintf("env[%q]", name), "%v", err)
		}
		env[name] = task[name]
	}
	return env, nil
}

// CheckRelPath returns why name is not a clean relative path inside the
// workspace (no "..", no absolute path, bounded length), or "" if it is.
func CheckRelPath(name string) string { return checkRelPath(name) }

// IsPython reports whether p runs code in Python: a code file main.py run
// by an interpreter named python (python3, python3.11, ...).
func IsPython(p *Plan) bool {
	return p.CodeFile == CodeFileName("python") && len(p.Argv) > 0 && strings.HasPrefix(path.Base(p.Argv[0]), "python")
}
