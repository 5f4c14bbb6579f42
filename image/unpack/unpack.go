package unpack

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

var (
	// ErrUnsafeLayer reports a layer entry that names or leads outside the
	// root (absolute or ".." names, escaping whiteouts or hardlinks, writes
	// through symlinks that leave the root).
	ErrUnsafeLayer = errors.New("unsafe layer")
	// ErrTooLarge reports a layer set over the byte or entry limit.
	ErrTooLarge = errors.New("image too large")
)

// Default limits, shared by all layers of one image.
const (
	DefaultMaxBytes   int64 = 8 << 30
	DefaultMaxEntries int64 = 1_000_000
)

const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// Limits caps what all layers of one image may expand to. Zero fields take
// the defaults.
type Limits struct {
	MaxBytes   int64 // uncompressed tar bytes read, over all layers
	MaxEntries int64 // tar entries, over all layers
}

// Unpacker applies layers onto one root. It is not safe for concurrent use.
type Unpacker struct {
	root   *os.Root
	limits Limits
	asRoot bool // running as uid 0: apply ownership, keep modes as given

	bytes   int64 // tar bytes read so far
	written int64 // file bytes written so far (sparse files expand past what is read)
	entries int64 // entries seen so far

	// Skipped counts entries deliberately not created (device nodes,
	// fifos, unknown types).
	Skipped int
}

// New returns an unpacker that writes only inside root.
func New(root *os.Root, limits Limits) *Unpacker {
	if limits.MaxBytes <= 0 {
		limits.MaxBytes = DefaultMaxBytes
	}
	if limits.MaxEntries <= 0 {
		limits.MaxEntries = DefaultMaxEntries
	}
	return &Unpacker{root: root, limits: limits, asRoot: os.Geteuid() == 0}
}

// countingReader enforces the byte limit on the uncompressed stream.
type countingReader struct {
	r        io.Reader
	u        *Unpacker
	exceeded bool
}

func (c *countingReader) Read(p []byte) (int, error) {
	if c.exceeded {
		return 0, c.u.tooManyBytes()
	}
	n, err := c.r.Read(p)
	c.u.bytes += int64(n)
	if c.u.bytes > c.u.limits.MaxBytes {
		c.exceeded = true
		return n, c.u.tooManyBytes()
	}
	return n, err
}

func (u *Unpacker) tooManyBytes() error {
	return fmt.Errorf("%w: layers expand past %d bytes uncompressed (decompression bomb?)", ErrTooLarge, u.limits.MaxBytes)
}

// layerState tracks one layer's entries, for opaque whiteouts: they hide
// lower layers' contents only, never the same layer's.
type layerState struct {
	created map[string]bool // entries (and their parents) of this layer
}

func (l *layerState) add(name string) {
	for name != "." && name != "/" && name != "" {
		if l.created[name] {
			return
		}
		l.created[name] = true
		name = path.Dir(name)
	}
}

// Layer applies one uncompressed layer (a tar stream) on top of what the
// root already holds. It reads r to its end, so that a caller hashing the
// stream sees every byte. On error the root is left half-written: the
// caller must discard it.
func (u *Unpacker) Layer(ctx context.Context, r io.Reader) error {
	cr := &countingReader{r: r, u: u}
	tr := tar.NewReader(cr)
	st := &layerState{created: map[string]bool{}}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, tar.ErrInsecurePath) {
			err = nil // checked below, with a clearer message
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			if cr.exceeded {
				return u.tooManyBytes()
			}
			return fmt.Errorf("reading layer tar: %w", err)
		}
		u.entries++
		if u.entries > u.limits.MaxEntries {
			return fmt.Errorf("%w: layers hold more than %d entries (decompression bomb?)", ErrTooLarge, u.limits.MaxEntries)
		}
		if err := u.entry(hdr, tr, st); err != nil {
			if cr.exceeded {
				return u.tooManyBytes()
			}
			return fmt.Errorf("layer entry %q: %w", hdr.Name, err)
		}
	}
	// Drain the tar padding so the caller's digest covers the whole stream.
	if _, err := io.Copy(io.Discard, cr); err != nil {
		if cr.exceeded {
			return u.tooManyBytes()
		}
		return fmt.Errorf("reading layer tail: %w", err)
	}
	return nil
}

// CleanName turns a tar entry name into a root-relative path. It refuses
// empty and absolute names and any ".." element, even one that would clean
// away.
func CleanName(name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("%w: empty name", ErrUnsafeLayer)
	}
	if strings.ContainsRune(name, 0) {
		return "", fmt.Errorf("%w: name holds a NUL byte", ErrUnsafeLayer)
	}
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("%w: absolute name", ErrUnsafeLayer)
	}
	for _, el := range strings.Split(name, "/") {
		if el == ".." {
			return "", fmt.Errorf("%w: name holds \"..\"", ErrUnsafeLayer)
		}
	}
	return path.Clean(name), nil
}

func (u *Unpacker) entry(hdr *tar.Header, tr io.Reader, st *layerState) error {
	name, err := CleanName(hdr.Name)
	if err != nil {
		return err
	}
	dir, base := path.Split(name)
	dir = path.Clean(dir) // "" becomes "."

	if strings.HasPrefix(base, whiteoutPrefix) {
		return u.whiteout(dir, base, st)
	}

	if name == "." {
		if hdr.Typeflag != tar.TypeDir {
			return fmt.Errorf("%w: entry would replace the root directory", ErrUnsafeLayer)
		}
		return nil // the root's own mode and owner are the store's choice
	}

	switch hdr.Typeflag {
	case tar.TypeDir, tar.TypeReg, tar.TypeGNUSparse, tar.TypeSymlink, tar.TypeLink:
	default:
		// Device nodes, fifos and anything unknown: never created.
		u.Skipped++
		return nil
	}

	if dir != "." {
		if err := u.root.MkdirAll(dir, 0o755); err != nil {
			return u.rootErr("creating parent directory", err)
		}
	}

	// Whatever is in the way goes, except a directory kept for a directory.
	old, err := u.root.Lstat(name)
	switch {
	case err == nil:
		if !(old.IsDir() && hdr.Typeflag == tar.TypeDir) {
			if err := u.root.RemoveAll(name); err != nil {
				return u.rootErr("removing existing entry", err)
			}
		}
	case errors.Is(err, fs.ErrNotExist):
	default:
		return u.rootErr("inspecting existing entry", err)
	}
	st.add(name)

	mode := hdr.FileInfo().Mode() & (fs.ModePerm | fs.ModeSticky) // strips setuid and setgid

	switch hdr.Typeflag {
	case tar.TypeDir:
		if old == nil || !old.IsDir() {
			if err := u.root.Mkdir(name, 0o700); err != nil {
				return u.rootErr("creating directory", err)
			}
		}
		if !u.asRoot {
			mode |= 0o700 // keep the tree writable for the next layer
		}
		if err := u.owner(name, hdr); err != nil {
			return err
		}
		if err := u.root.Chmod(name, mode); err != nil {
			return u.rootErr("setting directory mode", err)
		}
		return nil

	case tar.TypeReg, tar.TypeGNUSparse:
		return u.file(name, hdr, tr, mode)

	case tar.TypeSymlink:
		if hdr.Linkname == "" || strings.ContainsRune(hdr.Linkname, 0) {
			return fmt.Errorf("%w: bad symlink target", ErrUnsafeLayer)
		}
		// The target is stored, never followed here: the root refuses
		// to resolve absolute or escaping links.
		if err := u.root.Symlink(hdr.Linkname, name); err != nil {
			return u.rootErr("creating symlink", err)
		}
		return u.owner(name, hdr)

	case tar.TypeLink:
		target, err := CleanName(hdr.Linkname)
		if err != nil {
			return fmt.Errorf("hardlink target %q: %w", hdr.Linkname, err)
		}
		if target == "." {
			return fmt.Errorf("%w: hardlink to the root directory", ErrUnsafeLayer)
		}
		if err := u.root.Link(target, name); err != nil {
			return u.rootErr(fmt.Sprintf("creating hardlink to %q", hdr.Linkname), err)
		}
		return nil
	}
	return nil
}

func (u *Unpacker) file(name string, hdr *tar.Header, tr io.Reader, mode fs.FileMode) error {
	if hdr.Size < 0 || hdr.Size > u.limits.MaxBytes-u.written {
		return fmt.Errorf("%w: files expand past %d bytes (decompression bomb?)", ErrTooLarge, u.limits.MaxBytes)
	}
	u.written += hdr.Size
	// O_EXCL: the name was just cleared, so a symlink in the way is
	// replaced, never followed.
	f, err := u.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return u.rootErr("creating file", err)
	}
	defer f.Close()
	if _, err := io.Copy(f, tr); err != nil {
		return fmt.Errorf("writing file: %w", err)
	}
	if u.asRoot {
		if err := f.Chown(hdr.Uid, hdr.Gid); err != nil {
			return fmt.Errorf("setting owner: %w", err)
		}
	}
	// After chown, which clears set-id bits anyway; they are stripped too.
	if err := f.Chmod(mode); err != nil {
		return fmt.Errorf("setting mode: %w", err)
	}
	if mt := hdr.ModTime; !mt.IsZero() {
		at := hdr.AccessTime
		if at.IsZero() {
			at = mt
		}
		tv := []unix.Timeval{unix.NsecToTimeval(at.UnixNano()), unix.NsecToTimeval(mt.UnixNano())}
		if err := unix.Futimes(int(f.Fd()), tv); err != nil {
			return fmt.Errorf("setting times: %w", err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("closing file: %w", err)
	}
	return nil
}

// owner applies the entry's uid and gid without following a final symlink.
func (u *Unpacker) owner(name string, hdr *tar.Header) error {
	if !u.asRoot {
		return nil
	}
	if err := u.root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
		return u.rootErr("setting owner", err)
	}
	return nil
}

// whiteout handles ".wh.NAME" (remove NAME from lower layers) and
// ".wh..wh..opq" (hide the lower layers' contents of dir).
func (u *Unpacker) whiteout(dir, base string, st *layerState) error {
	if base == whiteoutOpaque {
		return u.opaque(dir, st)
	}
	if strings.HasPrefix(base, whiteoutMeta) {
		u.Skipped++ // other AUFS metadata (.wh..wh.plnk and such)
		return nil
	}
	victim := strings.TrimPrefix(base, whiteoutPrefix)
	if victim == "" || victim == "." || victim == ".." {
		return fmt.Errorf("%w: whiteout names %q", ErrUnsafeLayer, victim)
	}
	if err := u.root.RemoveAll(path.Join(dir, victim)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return u.rootErr("applying whiteout", err)
	}
	return nil
}

func (u *Unpacker) opaque(dir string, st *layerState) error {
	fi, err := u.root.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return u.rootErr("inspecting opaque directory", err)
	}
	if !fi.IsDir() {
		return nil
	}
	d, err := u.root.Open(dir)
	if err != nil {
		return u.rootErr("opening opaque directory", err)
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return fmt.Errorf("listing opaque directory: %w", err)
	}
	for _, n := range names {
		p := path.Join(dir, n)
		if !st.created[p] {
			if err := u.root.RemoveAll(p); err != nil {
				return u.rootErr("clearing opaque directory", err)
			}
			continue
		}
		if err := u.opaque(p, st); err != nil {
			return err
		}
	}
	return nil
}

// rootErr marks the root's refusals to leave it as unsafe-layer errors.
func (u *Unpacker) rootErr(what string, err error) error {
	if isEscape(err) {
		return fmt.Errorf("%w: %s: path leads outside the root: %v", ErrUnsafeLayer, what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// isEscape reports os.Root's "path escapes from parent" refusal. The os
// package does not export that error, so it is matched by its text.
func isEscape(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if e.Error() == "path escapes from parent" {
			return true
		}
	}
	return false
}
