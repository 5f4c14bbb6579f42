package imagetest

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Registry starts an in-process registry on 127.0.0.1 and returns its
// host:port. It is closed at t.Cleanup.
func Registry(t testing.TB) (host string) {
	t.Helper()
	return RegistryWith(t, nil)
}

// RegistryWith is Registry with middleware wrapped around the registry
// handler (auth checks, injected failures, corrupted blobs). A nil wrap
// serves the registry as is.
func RegistryWith(t testing.TB, wrap func(http.Handler) http.Handler) (host string) {
	t.Helper()
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// Image builds a linux/GOARCH image from layer tars (uncompressed or
// gzip), bottom layer first.
func Image(t testing.TB, layers ...[]byte) v1.Image {
	t.Helper()
	return ImageFor(t, v1.Platform{OS: "linux", Architecture: runtime.GOARCH}, layers...)
}

// ImageFor is Image for another platform.
func ImageFor(t testing.TB, p v1.Platform, layers ...[]byte) v1.Image {
	t.Helper()
	img, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{
		OS:           p.OS,
		Architecture: p.Architecture,
		Variant:      p.Variant,
		RootFS:       v1.RootFS{Type: "layers"},
		Config:       v1.Config{Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin"}},
	})
	if err != nil {
		t.Fatalf("setting config: %v", err)
	}
	for i, data := range layers {
		data := data
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(data)), nil
		})
		if err != nil {
			t.Fatalf("layer %d: %v", i, err)
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			t.Fatalf("appending layer %d: %v", i, err)
		}
	}
	return img
}

// DirImage builds a one-layer linux/GOARCH image from a directory tree.
func DirImage(t testing.TB, rootfs string) v1.Image {
	t.Helper()
	return Image(t, TarDir(t, rootfs))
}

// Push writes img to host/repo:tag, with credentials from the docker
// config if it has any, and returns its manifest digest.
func Push(t testing.TB, host, repo, tag string, img v1.Image) (digest string) {
	t.Helper()
	ref, err := name.NewTag(host + "/" + repo + ":" + tag)
	if err != nil {
		t.Fatalf("parsing tag: %v", err)
	}
	if err := remote.Write(ref, img, remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatalf("image digest: %v", err)
	}
	return d.String()
}

// PushDir tars rootfs into one layer, sets a linux/GOARCH config, pushes
// it to host/repo:tag and returns the manifest digest.
func PushDir(t testing.TB, host, repo, tag string, rootfs string) (digest string) {
	t.Helper()
	return Push(t, host, repo, tag, DirImage(t, rootfs))
}

// WriteLayout writes rootfsDir as a one-layer image into an OCI image
// layout at dir (created or appended to), annotated with tag, and returns
// the manifest digest.
func WriteLayout(t testing.TB, dir, tag, rootfsDir string) (digest string) {
	t.Helper()
	return WriteLayoutImage(t, dir, tag, DirImage(t, rootfsDir))
}

// WriteLayoutImage appends img to the OCI layout at dir, annotated with
// tag unless tag is empty.
func WriteLayoutImage(t testing.TB, dir, tag string, img v1.Image) (digest string) {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		if p, err = layout.Write(dir, empty.Index); err != nil {
			t.Fatalf("creating layout: %v", err)
		}
	}
	var opts []layout.Option
	if tag != "" {
		opts = append(opts, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": tag}))
	}
	if err := p.AppendImage(img, opts...); err != nil {
		t.Fatalf("writing layout: %v", err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatalf("image digest: %v", err)
	}
	return d.String()
}

// WriteDockerArchive writes rootfsDir as a one-layer image into a
// `docker save` style tarball at path, tagged tag (e.g. "example/x:1").
func WriteDockerArchive(t testing.TB, path, tag, rootfsDir string) {
	t.Helper()
	ref, err := name.NewTag(tag)
	if err != nil {
		t.Fatalf("parsing tag: %v", err)
	}
	if err := tarball.WriteToFile(path, ref, DirImage(t, rootfsDir)); err != nil {
		t.Fatalf("writing docker archive: %v", err)
	}
}

// TarDir returns an uncompressed tar of the tree under dir, with names
// relative to it, owned by root.
func TarDir(t testing.TB, dir string) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteTar(&buf, dir); err != nil {
		t.Fatalf("tarring %s: %v", dir, err)
	}
	return buf.Bytes()
}

// WriteTar writes the tree under dir to w as an uncompressed tar, owned by
// root, as a layer would hold it.
func WriteTar(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := io.Copy(tw, f); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// WriteTree creates files under dir from a map of relative path to
// content; a path ending in "/" is a directory.
func WriteTree(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for p, content := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if strings.HasSuffix(p, "/") {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// HashTree hashes every name, type, mode, owner, link target and content
// under dir (without following symlinks), to check that nothing changed.
func HashTree(t testing.TB, dir string) string {
	t.Helper()
	h := sha256.New()
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		line := fmt.Sprintf("%s %v", rel, fi.Mode())
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			line += fmt.Sprintf(" %d:%d n%d", st.Uid, st.Gid, st.Nlink)
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			line += " -> " + target
		case fi.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(data)
			line += " " + hex.EncodeToString(sum[:])
		case !fi.IsDir():
			return nil
		}
		if !fi.IsDir() && fi.Mode().IsRegular() || fi.Mode()&fs.ModeSymlink != 0 {
			line += fmt.Sprintf(" %d", fi.ModTime().UnixNano())
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		t.Fatalf("hashing %s: %v", dir, err)
	}
	sort.Strings(lines)
	for _, l := range lines {
		io.WriteString(h, l+"\n")
	}
	return hex.EncodeToString(h.Sum(nil))
}
