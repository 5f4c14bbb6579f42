package image

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/docker/go-units"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/image/unpack"
)

// unpackImage downloads img's blobs, verifies them, unpacks the layers
// bottom-up into a staging dir, prepares its mount points and renames it
// to the digest's rootfs path. The caller holds the digest's lock. It
// returns the rootfs size.
func (s *Store) unpackImage(ctx context.Context, img v1.Image, digest v1.Hash, progress io.Writer) (int64, error) {
	rawManifest, err := img.RawManifest()
	if err != nil {
		return 0, fmt.Errorf("reading manifest: %w", err)
	}
	if err := s.putBlob(digest, rawManifest, "manifest"); err != nil {
		return 0, err
	}
	m, err := img.Manifest()
	if err != nil {
		return 0, fmt.Errorf("reading manifest: %w", err)
	}
	rawConfig, err := img.RawConfigFile()
	if err != nil {
		return 0, fmt.Errorf("reading config: %w", err)
	}
	if err := s.putBlob(m.Config.Digest, rawConfig, "config"); err != nil {
		return 0, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return 0, fmt.Errorf("reading config: %w", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return 0, fmt.Errorf("listing layers: %w", err)
	}
	if len(layers) != len(m.Layers) || len(layers) != len(cf.RootFS.DiffIDs) {
		return 0, fmt.Errorf("image has %d layers, %d manifest entries and %d diff_ids", len(layers), len(m.Layers), len(cf.RootFS.DiffIDs))
	}

	// Download everything first: a bad blob fails the pull before any
	// unpack work.
	var total int64
	for _, d := range m.Layers {
		total += d.Size
	}
	fmt.Fprintf(progress, "pulling %d layers (%s)\n", len(layers), units.BytesSize(float64(total)))
	for i, l := range layers {
		d := m.Layers[i].Digest
		if err := s.fetchLayer(ctx, l, d, m.Layers[i].Size); err != nil {
			return 0, err
		}
		fmt.Fprintf(progress, "  layer %d/%d %s %s\n", i+1, len(layers), short(d), units.BytesSize(float64(m.Layers[i].Size)))
	}

	// Unpack into a locked staging dir; only a complete, verified tree is
	// renamed to its published path.
	staging := filepath.Join(s.dir, "staging", randomName())
	if err := os.Mkdir(staging, 0o700); err != nil {
		return 0, fmt.Errorf("creating staging dir: %w", err)
	}
	published := false
	defer func() {
		if !published {
			os.RemoveAll(staging)
		}
	}()
	sf, err := os.Open(staging)
	if err != nil {
		return 0, fmt.Errorf("opening staging dir: %w", err)
	}
	defer sf.Close()
	if _, err := lockFile(ctx, sf, false); err != nil {
		return 0, fmt.Errorf("locking staging dir: %w", err)
	}
	root, err := os.OpenRoot(staging)
	if err != nil {
		return 0, fmt.Errorf("opening staging dir: %w", err)
	}
	defer root.Close()

	fmt.Fprintf(progress, "unpacking %s\n", short(digest))
	u := unpack.New(root, unpack.Limits{MaxBytes: s.maxBytes(), MaxEntries: s.MaxEntries})
	for i := range layers {
		if err := s.applyLayer(ctx, u, m.Layers[i].Digest, cf.RootFS.DiffIDs[i]); err != nil {
			return 0, fmt.Errorf("layer %d/%d %s: %w", i+1, len(layers), m.Layers[i].Digest, err)
		}
	}
	if err := PrepareMountpoints(root); err != nil {
		return 0, err
	}
	if err := sf.Chmod(0o755); err != nil { // read by the container's uid 65534
		return 0, fmt.Errorf("setting rootfs mode: %w", err)
	}
	if err := unix.Syncfs(int(sf.Fd())); err != nil {
		return 0, fmt.Errorf("syncing rootfs: %w", err)
	}
	size := treeSize(staging)
	if err := os.Rename(staging, s.rootfsPath(digest)); err != nil {
		return 0, fmt.Errorf("publishing rootfs: %w", err)
	}
	published = true
	fmt.Fprintf(progress, "unpacked %s (%s)\n", short(digest), units.BytesSize(float64(size)))
	return size, nil
}

// putBlob stores a small blob after checking its digest.
func (s *Store) putBlob(d v1.Hash, data []byte, what string) error {
	sum := sha256.Sum256(data)
	if d.Algorithm != "sha256" || hex.EncodeToString(sum[:]) != d.Hex {
		return fmt.Errorf("%s: %w: want %s, got sha256:%x", what, ErrDigestMismatch, d, sum)
	}
	// A stored blob is used only if it still matches its digest; a corrupt
	// one is removed and fetched again.
	if ok, err := blobMatches(s.blobPath(d), d); err == nil && ok {
		return nil
	} else if err == nil {
		if err := os.Remove(s.blobPath(d)); err != nil {
			return fmt.Errorf("removing corrupt layer blob %s: %w", d, err)
		}
	}
	return s.writeBlob(d, bytes.NewReader(data), int64(len(data)))
}

// fetchLayer downloads a compressed layer into the blob store, verifying
// its digest, unless it is already there (it is verified again on use).
func (s *Store) fetchLayer(ctx context.Context, l v1.Layer, d v1.Hash, size int64) error {
	if d.Algorithm != "sha256" {
		return fmt.Errorf("layer %s: unsupported digest algorithm", d)
	}
	// A stored blob is used only if it still matches its digest; a corrupt
	// one is removed and fetched again.
	if ok, err := blobMatches(s.blobPath(d), d); err == nil && ok {
		return nil
	} else if err == nil {
		if err := os.Remove(s.blobPath(d)); err != nil {
			return fmt.Errorf("removing corrupt layer blob %s: %w", d, err)
		}
	}
	if size > s.maxBytes() {
		return fmt.Errorf("layer %s: %w: %d bytes compressed, limit %d (decompression bomb?)", d, ErrTooLarge, size, s.maxBytes())
	}
	return s.retry(ctx, "downloading layer "+d.String(), func() error {
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		defer rc.Close()
		return s.writeBlob(d, rc, size)
	})
}

// blobMatches reports whether the file at path hashes to d (an error when
// it cannot be read, e.g. it does not exist).
func blobMatches(path string, d v1.Hash) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return false, err
	}
	return hex.EncodeToString(h.Sum(nil)) == d.Hex, nil
}

// writeBlob copies r into blobs/, via a locked temp file in staging,
// and renames it into place only if its digest (and size, when known) match.
func (s *Store) writeBlob(d v1.Hash, r io.Reader, size int64) error {
	tmp, err := os.CreateTemp(filepath.Join(s.dir, "staging"), "blob-*")
	if err != nil {
		return fmt.Errorf("creating temp blob: %w", err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	if ok, err := tryLock(tmp); err != nil || !ok {
		return fmt.Errorf("locking temp blob: %v", err)
	}
	h := sha256.New()
	limit := s.maxBytes() + 1
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(r, limit))
	if err != nil {
		return err
	}
	if n >= limit {
		return fmt.Errorf("blob %s: %w: over %d bytes (decompression bomb?)", d, ErrTooLarge, s.maxBytes())
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != d.Hex || (size > 0 && n != size) {
		return fmt.Errorf("blob %s: %w: got sha256:%s, %d bytes", d, ErrDigestMismatch, got, n)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("writing blob: %w", err)
	}
	if err := os.Rename(tmp.Name(), s.blobPath(d)); err != nil {
		return fmt.Errorf("storing blob: %w", err)
	}
	return nil
}

var (
	gzipMagic = []byte{0x1f, 0x8b}
	zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}
)

// applyLayer unpacks a stored layer blob, checking while it streams that
// the blob still matches its digest and its content its diff_id.
func (s *Store) applyLayer(ctx context.Context, u *unpack.Unpacker, d, diffID v1.Hash) error {
	f, err := os.Open(s.blobPath(d))
	if err != nil {
		return fmt.Errorf("opening layer blob: %w", err)
	}
	defer f.Close()
	ch := sha256.New()
	br := bufio.NewReaderSize(io.TeeReader(f, ch), 1<<20)
	magic, _ := br.Peek(4)

	var tarStream io.Reader
	switch {
	case bytes.HasPrefix(magic, gzipMagic):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("opening gzip layer: %w", err)
		}
		defer zr.Close()
		tarStream = zr
	case bytes.HasPrefix(magic, zstdMagic):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(1<<27))
		if err != nil {
			return fmt.Errorf("opening zstd layer: %w", err)
		}
		defer zr.Close()
		tarStream = zr
	default:
		tarStream = br
	}
	uh := sha256.New()
	layerErr := u.Layer(ctx, io.TeeReader(tarStream, uh))

	// Read the blob to its end so its digest covers every byte.
	if _, err := io.Copy(io.Discard, br); err != nil {
		return fmt.Errorf("reading layer blob: %w", err)
	}
	if got := hex.EncodeToString(ch.Sum(nil)); got != d.Hex {
		return fmt.Errorf("%w: stored blob is sha256:%s", ErrDigestMismatch, got)
	}
	if layerErr != nil {
		return layerErr
	}
	if diffID.Algorithm == "sha256" {
		if got := hex.EncodeToString(uh.Sum(nil)); got != diffID.Hex {
			return fmt.Errorf("%w: uncompressed layer is sha256:%s, config says %s", ErrDigestMismatch, got, diffID)
		}
	}
	return nil
}

func short(d v1.Hash) string {
	if len(d.Hex) > 12 {
		return d.Algorithm + ":" + d.Hex[:12]
	}
	return d.String()
}
