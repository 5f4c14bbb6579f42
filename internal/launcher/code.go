package launcher

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentrun/agentrun/image"
	"github.com/agentrun/agentrun/internal/cachefile"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/task"
)

// The run launcher's bytecode. Python compiles the file it is given to
// run at every start, and never caches it: the launcher's compile was a
// tenth of a pooled print(45)'s CPU. So a cold or pooled run's program is
// the launcher's start (agentrun_start.py), a file of a few lines, which
// loads the launcher from the bytecode that the run's own image and
// interpreter made of it, when agentrun has it, and compiles its source
// otherwise.
//
// That bytecode is made once per image and interpreter (argv[0]), in a
// sandbox of its own that runs nothing but agentrun's compile program: no
// task's code, files, stdin or network ever run beside it, so a run can
// change no other run's launcher. It is the image's bytes, as its
// interpreter is: agentrun never reads it beyond its length, and mounts it
// read-only only into runs of the image and interpreter that made it; the
// launcher's start uses it only if it bears the running interpreter's
// magic number and loads as code. Bytecode is kept in memory and in the
// state dir (launcher/, a file per image, interpreter and launcher), each
// at most maxLauncherCode bytes and at most maxLauncherCodes of them.
//
// A long-lived runner makes it (Codes.Make: serve, the worker, mcp),
// after a run's set-up has found none, one compile at a time and one try
// per key per process; every runner uses what is there. A one-shot
// runner (agentrun run) makes it after its run has been answered
// (Codes.MakeAfter, then MakePending): the first cold run of an image
// runs the launcher's source, as a run without bytecode does, and its
// process compiles the bytecode once the result is out, for every cold
// run after it. A compile that failed there is not tried again by a
// one-shot runner for launcherRetry (a marker file beside the bytecode's),
// so that an image whose compile fails costs its runs no extra sandbox
// each.

// maxLauncherCode bounds a launcher's bytecode (CPython 3.11 makes 20 KB).
const maxLauncherCode = 256 << 10

// maxLauncherCodes bounds how many bytecodes are kept, in memory and in
// the state dir: past it, the oldest go.
const maxLauncherCodes = 64

// launcherCompileTimeout bounds a compile's sandbox.
const launcherCompileTimeout = 10 * time.Second

// launcherRetry is how long a one-shot runner leaves a key whose compile
// failed before it tries again.
const launcherRetry = time.Hour

// failedSuffix names a key's marker of a failed compile.
const failedSuffix = ".failed"

// maxPending bounds the compiles a one-shot runner makes after its runs.
const maxPending = 4

// compileLauncher is the compile's program (python3 -I -S -c): the
// interpreter's magic number and the launcher's code, marshalled, in
// base64 on stdout.
const compileLauncher = `import sys, marshal, binascii
m = sys.modules["_frozen_importlib_external"].MAGIC_NUMBER
with open("` + RunPath + `", "rb") as f:
    c = compile(f.read(), "` + RunPath + `", "exec", dont_inherit=True)
sys.stdout.write(binascii.b2a_base64(m + marshal.dumps(c)).decode())
`

// CompileFunc runs p, a compile's plan (compilePlan), in img, in a
// sandbox of its own that gets the run launcher's source alone
// (Request.Compile), and returns its result.
type CompileFunc func(ctx context.Context, p *task.Plan, img *image.Image) (*result.Result, error)

// Codes holds the run launcher's bytecode by key (launcherKey).
type Codes struct {
	dir     string // the state dir's launcher/
	compile CompileFunc
	logf    func(format string, args ...any)

	mu    sync.Mutex
	make  bool
	after bool // a miss is compiled by MakePending, not at once
	// pending are the misses MakePending compiles.
	pending []pendingCode
	mem     map[string][]byte
	order   []string        // mem's keys, oldest first
	tried   map[string]bool // keys this process made or tried to make
	busy    bool            // a compile is going on

	ctx    context.Context // the compiles'; close cancels it
	cancel context.CancelFunc
	bg     sync.WaitGroup
}

// NewCodes is the bytecode kept in dir, made with compile, whose failures
// go to logf (a compile's run of its own is on no run's result).
func NewCodes(dir string, compile CompileFunc, logf func(format string, args ...any)) *Codes {
	ctx, cancel := context.WithCancel(context.Background())
	return &Codes{dir: dir, compile: compile, logf: logf, mem: map[string][]byte{}, tried: map[string]bool{}, ctx: ctx, cancel: cancel}
}

// Make has c make the run launcher's bytecode for each image and
// interpreter its Python runs use, once, in a sandbox of its own. For a
// long-lived runner: a compile goes on after the run that asked for it.
func (c *Codes) Make() {
	c.mu.Lock()
	c.make = true
	c.mu.Unlock()
}

// pendingCode is a miss that MakePending compiles.
type pendingCode struct {
	p   *task.Plan
	img *image.Image
	key string
}

// MakeAfter has c make the run launcher's bytecode for the images and
// interpreters its Python runs missed, in MakePending. For a one-shot
// runner, whose process would end before a compile started with its run.
func (c *Codes) MakeAfter() {
	c.mu.Lock()
	c.after = true
	c.mu.Unlock()
}

// MakePending compiles, one at a time, the bytecode that c's runs missed
// since MakeAfter, each in a sandbox of its own, and keeps it in the state
// dir for the next process; a compile that fails is logged and marked, so
// that one-shot runners leave its key for launcherRetry. It returns when
// they have ended, or ctx is done.
func (c *Codes) MakePending(ctx context.Context) {
	c.mu.Lock()
	pending := c.pending
	c.pending = nil
	c.mu.Unlock()
	for _, m := range pending {
		if ctx.Err() != nil {
			return
		}
		err := c.compileFor(ctx, m.p, m.img, m.key)
		if err == nil || ctx.Err() != nil {
			continue
		}
		if c.logf != nil {
			c.logf("the run launcher's bytecode for image %s and %s: %v (its runs compile the launcher; tried again in %v)", m.img.Ref, m.p.Argv[0], err, launcherRetry)
		}
		_ = cachefile.Write(c.dir, m.key+failedSuffix, []byte(strconv.FormatInt(time.Now().Unix(), 10)))
	}
}

// failedLately reports whether a compile of key failed within
// launcherRetry (its marker in dir).
func failedLately(dir, key string) bool {
	b, err := cachefile.Read(filepath.Join(dir, key+failedSuffix), 32)
	if err != nil {
		return false
	}
	at, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return false
	}
	age := time.Since(time.Unix(at, 0))
	return age >= 0 && age < launcherRetry
}

// launcherSum is the launcher's own hash: a new launcher is compiled anew.
var launcherSum = sync.OnceValue(func() string {
	h := sha256.Sum256(runSource)
	return hex.EncodeToString(h[:])
})

// launcherKey names the bytecode that interpreter argv0 of img makes of
// this launcher. PATH, which finds argv0, is the same in every sandbox.
func launcherKey(img *image.Image, argv0 string) string {
	id := img.Digest
	if id == "" {
		id = "dir:" + img.Rootfs // a dir: image has no digest
	}
	h := sha256.New()
	for _, s := range []string{launcherSum(), id, argv0} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// For is the launcher's bytecode for a run of p in img, or nil; when
// there is none and c makes it, a compile starts in the background.
func (c *Codes) For(p *task.Plan, img *image.Image) []byte {
	key := launcherKey(img, p.Argv[0])
	c.mu.Lock()
	b, ok := c.mem[key]
	c.mu.Unlock()
	if ok {
		return b
	}
	if b, err := readLauncherCode(filepath.Join(c.dir, key)); err == nil {
		c.mu.Lock()
		c.keep(key, b)
		c.mu.Unlock()
		return b
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.after && !c.make {
		if !c.tried[key] && len(c.pending) < maxPending && !failedLately(c.dir, key) {
			c.tried[key] = true
			c.pending = append(c.pending, pendingCode{p: p, img: img, key: key})
		}
		return nil
	}
	if !c.make || c.busy || c.tried[key] || c.ctx.Err() != nil || len(c.tried) >= 16*maxLauncherCodes {
		return nil
	}
	c.tried[key], c.busy = true, true
	c.bg.Go(func() {
		err := c.compileFor(c.ctx, p, img, key)
		c.mu.Lock()
		c.busy = false
		c.mu.Unlock()
		if err != nil && c.ctx.Err() == nil && c.logf != nil {
			c.logf("the run launcher's bytecode for image %s and %s: %v (its runs compile the launcher)", img.Ref, p.Argv[0], err)
		}
	})
	return nil
}

// keep holds b as key's bytecode in memory, the oldest going past
// maxLauncherCodes. c.mu is held.
func (c *Codes) keep(key string, b []byte) {
	if _, ok := c.mem[key]; !ok {
		c.order = append(c.order, key)
	}
	c.mem[key] = b
	for len(c.order) > maxLauncherCodes {
		delete(c.mem, c.order[0])
		c.order = c.order[1:]
	}
}

// Close stops the compile going on, if any, and waits for it.
func (c *Codes) Close() {
	c.cancel()
	c.bg.Wait()
}

// readLauncherCode reads a kept bytecode file (cachefile.Read), at
// most maxLauncherCode bytes.
func readLauncherCode(path string) ([]byte, error) {
	b, err := cachefile.Read(path, maxLauncherCode)
	if err != nil {
		return nil, err
	}
	if len(b) < 5 {
		return nil, fmt.Errorf("%s: %d bytes is not a launcher's bytecode", path, len(b))
	}
	return b, nil
}

// compilePlan is the plan of the compile's sandbox for runs of p: p's
// image, runtime, interpreter and limits, but for its timeout and output
// bound; no code, files, stdin, environment, network, services or tools.
func compilePlan(p *task.Plan) *task.Plan {
	return &task.Plan{Image: p.Image, Runtime: p.Runtime, Env: map[string]string{},
		Argv:   []string{p.Argv[0], "-I", "-S", "-c", compileLauncher},
		Files:  map[string][]byte{},
		Limits: compileLimits(p.Limits)}
}

// compileLimits are a compile's: a run's, with a timeout of
// launcherCompileTimeout and room for the base64 of maxLauncherCode.
func compileLimits(l task.Limits) task.Limits {
	l.Timeout = launcherCompileTimeout
	l.OutputBytes = int64(base64.StdEncoding.EncodedLen(maxLauncherCode) + 2)
	return l
}

// compileFor makes the launcher's bytecode for runs of p in img, in a
// sandbox of its own, and keeps it as key's.
func (c *Codes) compileFor(ctx context.Context, p *task.Plan, img *image.Image, key string) error {
	res, err := c.compile(ctx, compilePlan(p), img)
	if err != nil {
		return err
	}
	if res.ExitCode != 0 || res.StdoutTruncated {
		return fmt.Errorf("the compile exited %d: %s", res.ExitCode, firstLine(res.Stderr))
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(res.Stdout))
	if err != nil || len(b) < 5 || len(b) > maxLauncherCode {
		return fmt.Errorf("the compile wrote no bytecode (%d bytes of output)", len(res.Stdout))
	}
	c.mu.Lock()
	c.keep(key, b)
	c.mu.Unlock()
	return writeLauncherCode(c.dir, key, b)
}

// firstLine is s's first line, at most 200 bytes.
func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}

// writeLauncherCode writes b as dir/key (cachefile.Write), and removes
// the oldest files past maxLauncherCodes.
func writeLauncherCode(dir, key string, b []byte) error {
	if err := cachefile.Write(dir, key, b); err != nil {
		return err
	}
	return pruneLauncherCodes(dir)
}

// pruneLauncherCodes removes dir's oldest files past maxLauncherCodes,
// and temporary files a writer left.
func pruneLauncherCodes(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	type file struct {
		name string
		mod  time.Time
	}
	var files []file
	for _, e := range entries {
		info, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue
		} else if err != nil {
			return err
		}
		if cachefile.Temporary(e.Name()) {
			if time.Since(info.ModTime()) > time.Minute {
				os.Remove(filepath.Join(dir, e.Name()))
			}
			continue
		}
		files = append(files, file{e.Name(), info.ModTime()})
	}
	slices.SortFunc(files, func(a, b file) int { return b.mod.Compare(a.mod) })
	for _, f := range files[min(len(files), maxLauncherCodes):] {
		if err := os.Remove(filepath.Join(dir, f.name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}
