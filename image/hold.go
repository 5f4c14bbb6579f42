package image

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// An image in use is held: a shared flock on its use lock, taken by Get
// and Hold and kept until Release. Pruning (by the size cap or Prune)
// takes that lock exclusively, without waiting, before it removes an
// image, and skips the image when it cannot: an image a run or a pooled
// sandbox holds, in this process or another, is never removed under it.

func (s *Store) useLock(d v1.Hash) string { return s.lockFor("use-" + d.Hex) }

// hold takes a hold on the image of digest d and checks that its rootfs
// is still there (pruning removes the rootfs before it lets go of the
// lock). ok is false when it is gone.
func (s *Store) hold(ctx context.Context, d v1.Hash) (_ *fileLock, ok bool, err error) {
	l, err := lockPath(ctx, s.useLock(d), true)
	if err != nil {
		return nil, false, err
	}
	if fi, err := os.Lstat(s.rootfsPath(d)); err != nil || !fi.IsDir() {
		l.unlock()
		return nil, false, nil
	}
	return l, true, nil
}

// Release ends the hold Get took on img. It may be called more than
// once, and on a nil image.
func (img *Image) Release() {
	if img != nil {
		img.hold.unlock()
	}
}

// Hold takes a hold of its own on img, for a user that outlives the
// caller's (a pooled sandbox): until release is called, pruning never
// removes the image. It fails if the image has been removed.
func (s *Store) Hold(img *Image) (release func() error, err error) {
	if img.Digest == "" {
		return func() error { return nil }, nil // dir: images are not stored
	}
	d, err := v1.NewHash(img.Digest)
	if err != nil {
		return nil, fmt.Errorf("image %q: %w", img.Ref, err)
	}
	l, ok, err := s.hold(context.Background(), d)
	if err != nil {
		return nil, fmt.Errorf("image %q: %w", img.Ref, err)
	}
	if !ok {
		return nil, fmt.Errorf("image %q: %w: %s was removed from the store", img.Ref, ErrNotFound, img.Digest)
	}
	return func() error { l.unlock(); return nil }, nil
}

// tryExclusive reports whether someone holds the image of digest d. When
// no one does, it returns the use lock taken exclusively: no one can take a hold
// until unlock, and by then the rootfs is gone.
func (s *Store) tryExclusive(d v1.Hash) (l *fileLock, inUse bool, err error) {
	f, err := os.OpenFile(s.useLock(d), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, false, fmt.Errorf("opening lock: %w", err)
	}
	ok, err := tryLock(f)
	if err != nil || !ok {
		f.Close()
		return nil, !ok && err == nil, err
	}
	return &fileLock{f: f}, false, nil
}

// dropUseLock removes the use lock of a removed image; the caller holds
// it exclusively and the gc lock exclusively.
func (s *Store) dropUseLock(d v1.Hash, l *fileLock) {
	os.Remove(s.useLock(d))
	l.unlock()
}

func (s *Store) imageSize(ie *imageEntry) int64 {
	n := max(ie.Size, 0)
	for _, b := range ie.Blobs {
		if d, err := v1.NewHash(b); err == nil {
			if fi, err := os.Lstat(s.blobPath(d)); err == nil {
				n += fi.Size()
			}
		}
	}
	return n
}

// Shrink removes the least recently used images, with their references,
// until the store's total is at most max, skipping every image in use.
// It returns the images it removed. It does nothing if a pull is going
// on (it would wait for it): the next call prunes.
func (s *Store) Shrink(max int64) ([]Entry, error) {
	gc, err := os.OpenFile(s.lockFor("gc"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("shrinking the store: %w", err)
	}
	defer gc.Close()
	if ok, err := tryLock(gc); err != nil || !ok {
		return nil, err
	}
	type victim struct {
		d    v1.Hash
		l    *fileLock
		size int64
	}
	var victims []victim
	err = s.withIndex(context.Background(), func(idx *index) (bool, error) {
		type cand struct {
			digest string
			used   time.Time
			size   int64
		}
		var cands []cand
		var total int64
		for digest, ie := range idx.Images {
			c := cand{digest: digest, used: ie.Created, size: s.imageSize(ie)}
			for _, e := range idx.Refs {
				if e.Digest == digest && e.LastUsed.After(c.used) {
					c.used = e.LastUsed
				}
			}
			cands = append(cands, c)
			total += c.size
		}
		slices.SortFunc(cands, func(a, b cand) int { return a.used.Compare(b.used) })
		for _, c := range cands {
			if total <= max {
				break
			}
			d, err := v1.NewHash(c.digest)
			if err != nil {
				continue
			}
			l, inUse, err := s.tryExclusive(d)
			if err != nil {
				return len(victims) > 0, err
			}
			if inUse {
				continue
			}
			delete(idx.Images, c.digest)
			for k, e := range idx.Refs {
				if e.Digest == c.digest {
					delete(idx.Refs, k)
				}
			}
			victims = append(victims, victim{d: d, l: l, size: c.size})
			total -= c.size
		}
		return len(victims) > 0, nil
	})
	var removed []Entry
	var errs []error
	for _, v := range victims {
		if rerr := s.removeRootfs(v.d); rerr != nil {
			errs = append(errs, rerr)
		} else {
			removed = append(removed, Entry{Digest: v.d.String(), Size: v.size})
		}
		s.dropUseLock(v.d, v.l)
	}
	if len(victims) > 0 {
		if _, gerr := s.gcBlobs(context.Background()); gerr != nil {
			errs = append(errs, gerr)
		}
	}
	if err := errors.Join(append([]error{err}, errs...)...); err != nil {
		return removed, fmt.Errorf("shrinking the store: %w", err)
	}
	return removed, nil
}

// orphanInUse reports whether the unindexed rootfs dir under rootfs/sha256
// named hex is held; Prune leaves such a rootfs alone.
func (s *Store) orphanInUse(hex string) (release func(), inUse bool) {
	d := v1.Hash{Algorithm: "sha256", Hex: hex}
	l, inUse, err := s.tryExclusive(d)
	if err != nil || inUse {
		return func() {}, true
	}
	return func() { s.dropUseLock(d, l) }, false
}
