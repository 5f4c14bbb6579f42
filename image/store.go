package image

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Store is the content-addressed image store under a directory: verified
// blobs, one unpacked rootfs per manifest digest, and an index of
// references. Several Stores, in one process or several, may share a
// directory: file locks keep them consistent.
//
// Layout under the directory (all 0700 except each rootfs, 0755):
//
//	blobs/sha256/<hex>    manifests, configs and compressed layers
//	rootfs/sha256/<hex>   unpacked root filesystems, never modified once there
//	staging/<random>      unpacks and downloads in progress (locked while live)
//	locks/                flock files
//	refs.json             reference -> digest index
type Store struct {
	dir string

	// MaxBytes caps an image's uncompressed layer bytes; 0 means 8 GiB.
	MaxBytes int64
	// MaxEntries caps an image's layer entries; 0 means 1,000,000.
	MaxEntries int64
	// Attempts is how many times a registry request is tried; 0 means 4.
	Attempts int
	// RetryWait is the first wait between tries, doubled after each; 0
	// means 500ms.
	RetryWait time.Duration
	// MaxTotal caps the store's size (Total): after a pull adds an image,
	// the least recently used images not in use are removed until the
	// store is under it. 0 means no cap.
	MaxTotal int64
}

// Image is an image ready to run.
type Image struct {
	Ref    string // as the user wrote it
	Digest string // "sha256:..." manifest digest ("" for dir: references)
	Rootfs string // absolute path of the unpacked root filesystem, shared read-only by every run: never modify it

	hold *fileLock // from Get and Pull until Release: no pruning removes the image
}

// PullOptions tune Get and Pull.
type PullOptions struct {
	Progress io.Writer    // nil = quiet
	Platform *v1.Platform // nil = linux/runtime.GOARCH
	// Registries, when set, bounds a pull from a registry: the reference
	// of a task, not the operator's. Get still returns an image the store
	// holds without asking anyone; nil allows any registry.
	Registries *Registries
}

// Entry is one reference in the store, or one image Prune removed.
type Entry struct {
	Ref      string
	Digest   string
	Size     int64 // bytes of regular files in the rootfs
	LastUsed time.Time
}

// Open opens (creating if needed) the store under dir, and removes what
// interrupted pulls left in its staging area.
func Open(dir string) (*Store, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("opening image store %q: %w", dir, err)
	}
	s := &Store{dir: abs}
	for _, d := range []string{"", "blobs", "blobs/sha256", "rootfs", "rootfs/sha256", "staging", "locks"} {
		p := filepath.Join(abs, d)
		if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("opening image store: %w", err)
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return nil, fmt.Errorf("opening image store: %w", err)
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("opening image store: %s is not a directory", p)
		}
		if fi.Mode().Perm() != 0o700 {
			if err := os.Chmod(p, 0o700); err != nil {
				return nil, fmt.Errorf("opening image store: %w", err)
			}
		}
	}
	// Clean up after crashed pulls, unless pulls are running right now
	// (they hold the gc lock shared; Prune cleans up later).
	gc, err := os.OpenFile(s.lockFor("gc"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening image store: %w", err)
	}
	defer gc.Close()
	if ok, _ := tryLock(gc); ok {
		if _, err := s.cleanStaging(); err != nil {
			return nil, fmt.Errorf("opening image store: %w", err)
		}
	}
	return s, nil
}

func (s *Store) maxBytes() int64 {
	if s.MaxBytes > 0 {
		return s.MaxBytes
	}
	return 8 << 30
}

func (s *Store) attempts() int {
	if s.Attempts > 0 {
		return s.Attempts
	}
	return 4
}

func (s *Store) retryWait() time.Duration {
	if s.RetryWait > 0 {
		return s.RetryWait
	}
	return 500 * time.Millisecond
}

func (s *Store) rootfsPath(d v1.Hash) string {
	return filepath.Join(s.dir, "rootfs", d.Algorithm, d.Hex)
}

func (s *Store) blobPath(d v1.Hash) string {
	return filepath.Join(s.dir, "blobs", d.Algorithm, d.Hex)
}

func (s *Store) lockFor(name string) string {
	return filepath.Join(s.dir, "locks", name+".lock")
}

// refLock is the lock serialising pulls of one reference. References share
// 256 lock files by hash, so that tasks naming ever new references cannot
// grow the store without bound.
func (s *Store) refLock(key string) string {
	return s.lockFor("ref-" + hashString(key)[:2])
}

// Get returns the image for ref, pulling and unpacking it only if the
// store lacks it, and marks it used. The image is held (no pruning
// removes it) until its Release. A dir: reference is returned as is.
// Errors are *Error.
func (s *Store) Get(ctx context.Context, ref string, opts PullOptions) (*Image, error) {
	r, err := parseReference(ref)
	if err != nil {
		return nil, &Error{Ref: ref, Err: err}
	}
	img, err := s.get(ctx, r, opts)
	if err != nil {
		return nil, &Error{Ref: ref, Remote: r.kind == kindRemote, Err: err}
	}
	return img, nil
}

func (s *Store) get(ctx context.Context, r reference, opts PullOptions) (*Image, error) {
	if r.kind == kindDir {
		return dirImage(r)
	}
	if img, err := s.lookupHeld(ctx, r); img != nil || err != nil {
		return img, err
	}
	if err := opts.allowed(r); err != nil {
		return nil, err
	}
	img, grew, err := s.pullHeld(ctx, r, opts, true)
	if err == nil && grew {
		s.shrink()
	}
	return img, err
}

// lookupHeld is lookup with a hold taken on the image found.
func (s *Store) lookupHeld(ctx context.Context, r reference) (*Image, error) {
	img, err := s.lookup(ctx, r)
	if img == nil || err != nil {
		return nil, err
	}
	d, _ := v1.NewHash(img.Digest)
	l, ok, err := s.hold(ctx, d)
	if err != nil || !ok {
		return nil, err // removed since the lookup: pull it again
	}
	img.hold = l
	return img, nil
}

// pullHeld pulls r under its locks (unless lookup finds it there first)
// and takes a hold on the image before letting the locks go, so that no
// pruning comes in between. grew reports a new image in the store.
func (s *Store) pullHeld(ctx context.Context, r reference, opts PullOptions, lookup bool) (img *Image, grew bool, err error) {
	unlock, err := s.lockPull(ctx, r.key)
	if err != nil {
		return nil, false, err
	}
	defer unlock()
	if lookup {
		if img, err := s.lookupHeld(ctx, r); img != nil || err != nil {
			return img, false, err
		}
	}
	img, grew, err = s.pull(ctx, r, opts)
	if err != nil {
		return nil, false, err
	}
	d, _ := v1.NewHash(img.Digest)
	l, ok, err := s.hold(ctx, d)
	if err != nil {
		return nil, false, err
	}
	if !ok {
		return nil, false, fmt.Errorf("pulling %q: the rootfs vanished", r.raw)
	}
	img.hold = l
	return img, grew, nil
}

// shrink applies MaxTotal after a pull added an image; a failure there is
// the store's, not the pull's, and the next pull tries again.
func (s *Store) shrink() {
	if s.MaxTotal > 0 {
		_, _ = s.Shrink(s.MaxTotal)
	}
}

// Pull re-resolves ref against its source and unpacks the image if its
// digest is new. The reference then points to that digest; an image it
// pointed to before stays until Prune. The image is held until its
// Release. Errors are *Error.
func (s *Store) Pull(ctx context.Context, ref string, opts PullOptions) (*Image, error) {
	r, err := parseReference(ref)
	if err != nil {
		return nil, &Error{Ref: ref, Err: err}
	}
	img, err := s.repull(ctx, r, opts)
	if err != nil {
		return nil, &Error{Ref: ref, Remote: r.kind == kindRemote, Err: err}
	}
	return img, nil
}

func (s *Store) repull(ctx context.Context, r reference, opts PullOptions) (*Image, error) {
	if r.kind == kindDir {
		return dirImage(r)
	}
	if err := opts.allowed(r); err != nil {
		return nil, err
	}
	img, grew, err := s.pullHeld(ctx, r, opts, false)
	if err == nil && grew {
		s.shrink()
	}
	return img, err
}

// allowed refuses a registry reference whose registry opts.Registries
// does not list, before anything is dialled.
func (opts PullOptions) allowed(r reference) error {
	if opts.Registries == nil || r.kind != kindRemote {
		return nil
	}
	if reg := r.remote.Context().RegistryStr(); !opts.Registries.lists(reg) {
		return &PolicyError{Registry: reg}
	}
	return nil
}

// lockPull takes the locks a pull of reference key holds: the gc lock
// shared, so that Remove and Prune never delete blobs or staging dirs
// under it, and the reference's lock, so that two Gets of one new
// reference pull it once.
func (s *Store) lockPull(ctx context.Context, key string) (unlock func(), err error) {
	gc, err := lockPath(ctx, s.lockFor("gc"), true)
	if err != nil {
		return nil, err
	}
	rl, err := lockPath(ctx, s.refLock(key), false)
	if err != nil {
		gc.unlock()
		return nil, err
	}
	return func() { rl.unlock(); gc.unlock() }, nil
}

func dirImage(r reference) (*Image, error) {
	fi, err := os.Stat(r.path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, r.raw)
		}
		return nil, fmt.Errorf("opening %s: %w", r.raw, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%w %q: not a directory", ErrBadReference, r.raw)
	}
	return &Image{Ref: r.raw, Rootfs: r.path}, nil
}

// lookup returns the stored image for r (marking it used), or nil.
func (s *Store) lookup(ctx context.Context, r reference) (*Image, error) {
	var img *Image
	err := s.withIndex(ctx, func(idx *index) (bool, error) {
		e := idx.Refs[r.key]
		if e == nil {
			return false, nil
		}
		d, err := v1.NewHash(e.Digest)
		if err != nil {
			return false, nil
		}
		rootfs := s.rootfsPath(d)
		if fi, err := os.Lstat(rootfs); err != nil || !fi.IsDir() {
			return false, nil // published rootfs gone: pull again
		}
		e.LastUsed = time.Now().UTC()
		img = &Image{Ref: r.raw, Digest: e.Digest, Rootfs: rootfs}
		return true, nil
	})
	return img, err
}

// pull resolves r and unpacks it unless its digest is present. The
// caller holds the gc lock (shared) and r's lock.
func (s *Store) pull(ctx context.Context, r reference, opts PullOptions) (_ *Image, grew bool, err error) {
	progress := opts.Progress
	if progress == nil {
		progress = io.Discard
	}
	fmt.Fprintf(progress, "resolving %s\n", r.raw)
	var tr http.RoundTripper
	if r.kind == kindRemote {
		tr = opts.Registries.transport(r.remote.Context().RegistryStr())
		if t, ok := tr.(*http.Transport); ok && opts.Registries != nil {
			defer t.CloseIdleConnections() // the pull's own
		}
	}
	img, err := s.resolve(ctx, r, wantPlatform(opts), tr)
	if err != nil {
		return nil, false, err
	}
	digest, err := img.Digest()
	if err != nil {
		return nil, false, fmt.Errorf("pulling %q: computing digest: %w", r.raw, err)
	}
	// One unpack per digest, whichever refs and processes ask for it.
	dl, err := lockPath(ctx, s.lockFor(digest.Algorithm+"-"+digest.Hex), false)
	if err != nil {
		return nil, false, err
	}
	defer dl.unlock()

	rootfs := s.rootfsPath(digest)
	var size int64 = -1
	if fi, err := os.Lstat(rootfs); err == nil && fi.IsDir() {
		fmt.Fprintf(progress, "%s: %s already unpacked\n", r.raw, digest)
	} else {
		grew = true
		if size, err = s.unpackImage(ctx, img, digest, progress); err != nil {
			return nil, false, fmt.Errorf("pulling %q: %w", r.raw, err)
		}
	}
	blobs, err := imageBlobs(img, digest)
	if err != nil {
		return nil, false, fmt.Errorf("pulling %q: %w", r.raw, err)
	}
	err = s.withIndex(ctx, func(idx *index) (bool, error) {
		now := time.Now().UTC()
		idx.Refs[r.key] = &refEntry{Ref: r.raw, Digest: digest.String(), LastUsed: now}
		ie := idx.Images[digest.String()]
		if ie == nil {
			ie = &imageEntry{Size: size, Blobs: blobs, Created: now}
			idx.Images[digest.String()] = ie
		}
		if ie.Size < 0 {
			ie.Size = treeSize(rootfs)
		}
		return true, nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("pulling %q: %w", r.raw, err)
	}
	fmt.Fprintf(progress, "%s: %s\n", r.raw, digest)
	return &Image{Ref: r.raw, Digest: digest.String(), Rootfs: rootfs}, grew, nil
}

// imageBlobs lists the blobs an image keeps alive: manifest, config, layers.
func imageBlobs(img v1.Image, digest v1.Hash) ([]string, error) {
	m, err := img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("reading manifest: %w", err)
	}
	blobs := []string{digest.String(), m.Config.Digest.String()}
	for _, l := range m.Layers {
		blobs = append(blobs, l.Digest.String())
	}
	return blobs, nil
}

// List returns every reference in the store, sorted.
func (s *Store) List() ([]Entry, error) {
	idx, err := s.readIndexLocked()
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, e := range idx.Refs {
		ent := Entry{Ref: e.Ref, Digest: e.Digest, LastUsed: e.LastUsed}
		if ie := idx.Images[e.Digest]; ie != nil {
			ent.Size = ie.Size
		}
		out = append(out, ent)
	}
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Ref, b.Ref) })
	return out, nil
}

// Remove drops ref, and the image's rootfs and blobs if no other
// reference uses its digest. A run still using that rootfs loses it.
func (s *Store) Remove(ref string) error {
	r, err := parseReference(ref)
	if err != nil {
		return err
	}
	if r.kind == kindDir {
		return fmt.Errorf("removing %q: dir: references are not stored", ref)
	}
	ctx := context.Background()
	gc, err := lockPath(ctx, s.lockFor("gc"), false)
	if err != nil {
		return err
	}
	defer gc.unlock()
	var gone string
	err = s.withIndex(ctx, func(idx *index) (bool, error) {
		e := idx.Refs[r.key]
		if e == nil {
			return false, fmt.Errorf("removing %q: %w in store", ref, ErrNotFound)
		}
		delete(idx.Refs, r.key)
		if !idx.used(e.Digest) {
			delete(idx.Images, e.Digest)
			gone = e.Digest
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	if gone != "" {
		if d, err := v1.NewHash(gone); err == nil {
			if err := s.removeRootfs(d); err != nil {
				return fmt.Errorf("removing %q: %w", ref, err)
			}
			os.Remove(s.useLock(d))
		}
	}
	if _, err := s.gcBlobs(ctx); err != nil {
		return fmt.Errorf("removing %q: %w", ref, err)
	}
	return nil
}

// Prune removes unpacked images no reference points to, blobs no image
// needs, and staging dirs interrupted pulls left. It returns the images
// it removed.
func (s *Store) Prune(ctx context.Context) ([]Entry, error) {
	gc, err := lockPath(ctx, s.lockFor("gc"), false)
	if err != nil {
		return nil, err
	}
	defer gc.unlock()
	if _, err := s.cleanStaging(); err != nil {
		return nil, fmt.Errorf("pruning: %w", err)
	}
	var removed []Entry
	err = s.withIndex(ctx, func(idx *index) (bool, error) {
		changed := false
		for d := range idx.Images {
			if !idx.used(d) {
				delete(idx.Images, d)
				changed = true
			}
		}
		dir := filepath.Join(s.dir, "rootfs", "sha256")
		ents, err := os.ReadDir(dir)
		if err != nil {
			return changed, err
		}
		for _, ent := range ents {
			d := v1.Hash{Algorithm: "sha256", Hex: ent.Name()}
			if idx.Images[d.String()] != nil {
				continue
			}
			release, inUse := s.orphanInUse(ent.Name())
			if inUse {
				continue // a run or a pooled sandbox still has it
			}
			size := treeSize(filepath.Join(dir, ent.Name()))
			err := s.removeRootfs(d)
			release()
			if err != nil {
				return changed, err
			}
			removed = append(removed, Entry{Digest: d.String(), Size: size})
		}
		return changed, nil
	})
	if err != nil {
		return removed, fmt.Errorf("pruning: %w", err)
	}
	if _, err := s.gcBlobs(ctx); err != nil {
		return removed, fmt.Errorf("pruning: %w", err)
	}
	return removed, nil
}

// removeRootfs moves a rootfs into staging, so that no half-deleted tree
// is ever at its published path, then deletes it.
func (s *Store) removeRootfs(d v1.Hash) error {
	src := s.rootfsPath(d)
	dst := filepath.Join(s.dir, "staging", "rm-"+randomName())
	if err := os.Rename(src, dst); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("removing rootfs %s: %w", d, err)
	}
	if err := os.RemoveAll(dst); err != nil {
		return fmt.Errorf("removing rootfs %s: %w", d, err)
	}
	return nil
}

// gcBlobs deletes blobs no indexed image lists. The caller holds the gc
// lock exclusively, so no pull is using blobs not yet indexed.
func (s *Store) gcBlobs(ctx context.Context) (int, error) {
	idx, err := s.readIndexLocked()
	if err != nil {
		return 0, err
	}
	live := map[string]bool{}
	for _, ie := range idx.Images {
		for _, b := range ie.Blobs {
			live[b] = true
		}
	}
	dir := filepath.Join(s.dir, "blobs", "sha256")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("listing blobs: %w", err)
	}
	n := 0
	for _, ent := range ents {
		if live["sha256:"+ent.Name()] {
			continue
		}
		if err := os.Remove(filepath.Join(dir, ent.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return n, fmt.Errorf("removing blob: %w", err)
		}
		n++
	}
	return n, nil
}

// cleanStaging removes staging entries whose owner is gone: a live pull
// holds a flock on its entry. The caller holds the gc lock exclusively, so
// no pull is between creating an entry and locking it.
func (s *Store) cleanStaging() (int, error) {
	dir := filepath.Join(s.dir, "staging")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("listing staging: %w", err)
	}
	n := 0
	for _, ent := range ents {
		p := filepath.Join(dir, ent.Name())
		f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			// Not lockable (a symlink, say): nothing of ours is live there.
			os.RemoveAll(p)
			n++
			continue
		}
		ok, err := tryLock(f)
		if err != nil || !ok {
			f.Close()
			continue // in use by a live pull
		}
		rmErr := os.RemoveAll(p)
		f.Close()
		if rmErr != nil {
			return n, fmt.Errorf("removing stale staging %s: %w", ent.Name(), rmErr)
		}
		n++
	}
	return n, nil
}

// treeSize sums the sizes of regular files under dir, each inode once.
func treeSize(dir string) int64 {
	var total int64
	seen := map[uint64]bool{}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
		}
		total += fi.Size()
		return nil
	})
	return total
}

func randomName() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func hashString(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:16])
}

// index is refs.json.
type index struct {
	Refs   map[string]*refEntry   `json:"refs"`   // canonical reference -> entry
	Images map[string]*imageEntry `json:"images"` // manifest digest -> entry
}

type refEntry struct {
	Ref      string    `json:"ref"` // as last written by a user
	Digest   string    `json:"digest"`
	LastUsed time.Time `json:"last_used"`
}

type imageEntry struct {
	Size    int64     `json:"size"`
	Blobs   []string  `json:"blobs"` // manifest, config, layers
	Created time.Time `json:"created"`
}

func (idx *index) used(digest string) bool {
	for _, e := range idx.Refs {
		if e.Digest == digest {
			return true
		}
	}
	return false
}

func (s *Store) indexPath() string { return filepath.Join(s.dir, "refs.json") }

func (s *Store) readIndex() (*index, error) {
	idx := &index{Refs: map[string]*refEntry{}, Images: map[string]*imageEntry{}}
	data, err := os.ReadFile(s.indexPath())
	if errors.Is(err, fs.ErrNotExist) {
		return idx, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading image index: %w", err)
	}
	if err := json.Unmarshal(data, idx); err != nil {
		return nil, fmt.Errorf("reading image index %s: %w", s.indexPath(), err)
	}
	if idx.Refs == nil {
		idx.Refs = map[string]*refEntry{}
	}
	if idx.Images == nil {
		idx.Images = map[string]*imageEntry{}
	}
	return idx, nil
}

func (s *Store) readIndexLocked() (*index, error) {
	l, err := lockPath(context.Background(), s.lockFor("refs"), true)
	if err != nil {
		return nil, err
	}
	defer l.unlock()
	return s.readIndex()
}

// withIndex runs fn on the index under its exclusive lock and writes the
// index back (atomically: temp file, fsync, rename) if fn reports a change.
func (s *Store) withIndex(ctx context.Context, fn func(*index) (changed bool, err error)) error {
	l, err := lockPath(ctx, s.lockFor("refs"), false)
	if err != nil {
		return err
	}
	defer l.unlock()
	idx, err := s.readIndex()
	if err != nil {
		return err
	}
	changed, err := fn(idx)
	if changed {
		if werr := s.writeIndex(idx); werr != nil && err == nil {
			err = werr
		}
	}
	return err
}

func (s *Store) writeIndex(idx *index) error {
	data, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding image index: %w", err)
	}
	tmp, err := os.CreateTemp(s.dir, ".refs-*.json")
	if err != nil {
		return fmt.Errorf("writing image index: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err = tmp.Write(data); err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), s.indexPath())
	}
	if err != nil {
		return fmt.Errorf("writing image index: %w", err)
	}
	return nil
}

// Available tells whether ref can be had without doing the work: an
// image the store holds, a dir: root filesystem that exists, a layout or
// archive that holds the image, or a registry that answers for it (one
// try, within ctx). It pulls and unpacks nothing. where says which.
func (s *Store) Available(ctx context.Context, ref string) (where string, err error) {
	r, err := parseReference(ref)
	if err != nil {
		return "", &Error{Ref: ref, Err: err}
	}
	if r.kind == kindDir {
		if _, err := dirImage(r); err != nil {
			return "", &Error{Ref: ref, Err: err}
		}
		return "a root filesystem on disk", nil
	}
	if idx, err := s.readIndexLocked(); err == nil {
		if e := idx.Refs[r.key]; e != nil {
			if d, err := v1.NewHash(e.Digest); err == nil {
				if fi, err := os.Lstat(s.rootfsPath(d)); err == nil && fi.IsDir() {
					return "in the store (" + e.Digest + ")", nil
				}
			}
		}
	}
	once := &Store{dir: s.dir, Attempts: 1}
	var tr http.RoundTripper
	if r.kind == kindRemote {
		tr = (*Registries)(nil).transport("")
	}
	if _, err := once.resolve(ctx, r, wantPlatform(PullOptions{}), tr); err != nil {
		return "", &Error{Ref: ref, Remote: r.kind == kindRemote, Err: err}
	}
	if r.kind == kindRemote {
		return "not in the store; its registry answers, it is pulled on first use", nil
	}
	return "not in the store; its source holds it, it is unpacked on first use", nil
}
