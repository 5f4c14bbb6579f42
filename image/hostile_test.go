package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/image/imagetest"
)

// The staging dir is <base>/store/staging/<random>, so this many ".."
// reach <base>, where the canary lives.
const up = "../../../"

func TestHostileImages(t *testing.T) {
	nt := imagetest.NewTar
	good := func(t *testing.T) []byte {
		return nt(t).Dir("etc/", 0o755).File("etc/os-release", "ID=x\n", 0o644).Bytes()
	}
	tests := []struct {
		name    string
		layers  func(t *testing.T) [][]byte
		wantErr error
		verify  func(t *testing.T, rootfs string)
	}{
		{"dotdot entry", func(t *testing.T) [][]byte {
			return [][]byte{good(t), nt(t).File(up+"outside/x", "pwned", 0o644).Bytes()}
		}, ErrUnsafeLayer, nil},
		{"absolute entry", func(t *testing.T) [][]byte { return [][]byte{nt(t).File("/agentrun-canary", "pwned", 0o644).Bytes()} }, ErrUnsafeLayer, nil},
		{"symlink to /etc then file", func(t *testing.T) [][]byte {
			return [][]byte{nt(t).Symlink("a", "/etc").Bytes(), nt(t).File("a/agentrun-canary", "pwned", 0o644).Bytes()}
		}, ErrUnsafeLayer, nil},
		{"symlink to /etc then passwd", func(t *testing.T) [][]byte {
			return [][]byte{nt(t).Symlink("a", "/etc").File("a/passwd", "pwned", 0o644).Bytes()}
		}, ErrUnsafeLayer, nil},
		{"relative escaping symlink then file", func(t *testing.T) [][]byte {
			return [][]byte{nt(t).Symlink("a", "../../..").Bytes(), nt(t).File("a/agentrun-canary", "pwned", 0o644).Bytes()}
		}, ErrUnsafeLayer, nil},
		{"symlink to the canary then file", func(t *testing.T) [][]byte {
			return [][]byte{nt(t).Symlink("a", up+"outside").File("a/passwd", "pwned", 0o644).Bytes()}
		}, ErrUnsafeLayer, nil},
		{"hardlink to /etc/passwd", func(t *testing.T) [][]byte { return [][]byte{nt(t).Link("p", "/etc/passwd").Bytes()} }, ErrUnsafeLayer, nil},
		{"hardlink to ../../outside", func(t *testing.T) [][]byte { return [][]byte{nt(t).Link("p", "../../outside").Bytes()} }, ErrUnsafeLayer, nil},
		{"hardlink to the canary", func(t *testing.T) [][]byte { return [][]byte{nt(t).Link("p", up+"outside/passwd").Bytes()} }, ErrUnsafeLayer, nil},
		{"whiteout of dotdot", func(t *testing.T) [][]byte { return [][]byte{good(t), nt(t).File(".wh...", "", 0o644).Bytes()} }, ErrUnsafeLayer, nil},
		{"whiteout of dotdot in a dir", func(t *testing.T) [][]byte {
			return [][]byte{good(t), nt(t).Dir("x/", 0o755).Dir("x/.wh.../", 0o755).Bytes()}
		}, ErrUnsafeLayer, nil},
		{"file replaces symlink to the canary", func(t *testing.T) [][]byte {
			return [][]byte{nt(t).Symlink("passwd", up+"outside/passwd").Symlink("etc", "/etc").Bytes(),
				nt(t).File("passwd", "mine", 0o644).Dir("etc/", 0o755).File("etc/os-release", "ID=x\n", 0o644).Bytes()}
		}, nil, func(t *testing.T, rootfs string) {
			fi, err := os.Lstat(filepath.Join(rootfs, "passwd"))
			if err != nil || !fi.Mode().IsRegular() || readFile(t, filepath.Join(rootfs, "passwd")) != "mine" {
				t.Fatalf("passwd: %v %v; want a regular file holding %q", fi, err, "mine")
			}
			if fi, err := os.Lstat(filepath.Join(rootfs, "etc")); err != nil || !fi.IsDir() {
				t.Fatalf("etc: %v %v; want a real directory", fi, err)
			}
		}},
		{"device node skipped, setuid stripped", func(t *testing.T) [][]byte {
			return [][]byte{nt(t).Dir("dev/", 0o755).Device("dev/sda", 8, 0).Device("dev/kmem", 1, 2).File("bin/su", "x", 0o4755).File("bin/sg", "x", 0o2711).Bytes()}
		}, nil, func(t *testing.T, rootfs string) {
			if ents, _ := os.ReadDir(filepath.Join(rootfs, "dev")); len(ents) != 0 {
				t.Fatalf("dev holds %v; want nothing", ents)
			}
			for n, want := range map[string]fs.FileMode{"bin/su": 0o755, "bin/sg": 0o711} {
				fi, err := os.Lstat(filepath.Join(rootfs, n))
				if err != nil || fi.Mode() != want {
					t.Fatalf("%s mode = %v (%v); want %v", n, fi.Mode(), err, want)
				}
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			host := imagetest.Registry(t)
			imagetest.Push(t, host, "test/evil", "v1", imagetest.Image(t, tc.layers(t)...))
			img, err := e.store.Get(context.Background(), host+"/test/evil:v1", PullOptions{})
			e.checkCanary(t)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Get: err = %v; want %v", err, tc.wantErr)
				}
				t.Logf("refused: %v", err)
				e.checkNothingPublished(t)
				return
			}
			if err != nil {
				t.Fatalf("Get: %v", err)
			}
			tc.verify(t, img.Rootfs)
		})
	}
}

func TestGzipBomb(t *testing.T) {
	e := newEnv(t)
	e.store.MaxBytes = 1 << 20
	host := imagetest.Registry(t)
	imagetest.Push(t, host, "test/bomb", "v1", imagetest.Image(t, imagetest.GzipBomb(t, 64<<20)))
	_, err := e.store.Get(context.Background(), host+"/test/bomb:v1", PullOptions{})
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "decompression bomb?") {
		t.Fatalf("err = %v; want ErrTooLarge saying decompression bomb?", err)
	}
	t.Logf("refused: %v", err)
	e.checkNothingPublished(t)
	e.checkCanary(t)
}

func TestEntryLimit(t *testing.T) {
	e := newEnv(t)
	e.store.MaxEntries = 50
	b := imagetest.NewTar(t)
	for i := range 100 {
		b.File("f/"+strings.Repeat("x", i+1), "", 0o644)
	}
	host := imagetest.Registry(t)
	imagetest.Push(t, host, "test/many", "v1", imagetest.Image(t, b.Bytes()))
	if _, err := e.store.Get(context.Background(), host+"/test/many:v1", PullOptions{}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("err = %v; want ErrTooLarge", err)
	}
	e.checkNothingPublished(t)
}

func TestCorruptLayerFromRegistry(t *testing.T) {
	e := newEnv(t)
	img := imagetest.Image(t, imagetest.NewTar(t).File("etc/os-release", "ID=x\n", 0o644).Bytes())
	layers, _ := img.Layers()
	ld, _ := layers[0].Digest()
	rc, _ := layers[0].Compressed()
	evil, _ := io.ReadAll(rc)
	evil[len(evil)/2] ^= 0xff // same size, other bytes
	host := imagetest.RegistryWith(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+ld.String()) {
				w.Write(evil) // not what the digest says
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	imagetest.Push(t, host, "test/app", "v1", img)
	_, err := e.store.Get(context.Background(), host+"/test/app:v1", PullOptions{})
	if !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("err = %v; want ErrDigestMismatch", err)
	}
	t.Logf("refused: %v", err)
	e.checkNothingPublished(t)
	if _, err := os.Lstat(e.store.blobPath(ld)); err == nil {
		t.Fatalf("corrupt layer blob was stored")
	}
}

func TestCorruptLayerInLayout(t *testing.T) {
	e := newEnv(t)
	dir := filepath.Join(t.TempDir(), "layout")
	img := imagetest.Image(t, imagetest.NewTar(t).File("etc/os-release", "ID=x\n", 0o644).Bytes())
	imagetest.WriteLayoutImage(t, dir, "v1", img)
	layers, _ := img.Layers()
	ld, _ := layers[0].Digest()
	// Same name, other content: the layout reader does not notice.
	evil := imagetest.Gzip(t, imagetest.NewTar(t).File("etc/os-release", "ID=evil\n", 0o644).Bytes())
	if err := os.WriteFile(filepath.Join(dir, "blobs", "sha256", ld.Hex), evil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := e.store.Get(context.Background(), "oci:"+dir+":v1", PullOptions{})
	if !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("err = %v; want ErrDigestMismatch", err)
	}
	e.checkNothingPublished(t)
}

// A blob corrupted in the store after download is never used: it is
// fetched again, and the image holds the original content.
func TestCorruptStoredBlob(t *testing.T) {
	e := newEnv(t)
	host := imagetest.Registry(t)
	img := imagetest.Image(t, imagetest.NewTar(t).File("etc/os-release", "ID=x\n", 0o644).Bytes())
	imagetest.Push(t, host, "test/app", "v1", img)
	layers, _ := img.Layers()
	ld, _ := layers[0].Digest()
	evil := imagetest.Gzip(t, imagetest.NewTar(t).File("etc/os-release", "ID=evil\n", 0o644).Bytes())
	if err := os.WriteFile(e.store.blobPath(ld), evil, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := e.store.Get(context.Background(), host+"/test/app:v1", PullOptions{})
	if err != nil {
		t.Fatalf("Get with a corrupt stored blob: %v; want it fetched again", err)
	}
	if b, err := os.ReadFile(filepath.Join(got.Rootfs, "etc", "os-release")); err != nil || string(b) != "ID=x\n" {
		t.Fatalf("os-release = %q, %v; want the original content", b, err)
	}
}

// The config's diff_ids pin the uncompressed content too.
func TestDiffIDChecked(t *testing.T) {
	e := newEnv(t)
	dir := filepath.Join(t.TempDir(), "layout")
	good := imagetest.Image(t, imagetest.NewTar(t).File("a", "good", 0o644).Bytes())
	imagetest.WriteLayoutImage(t, dir, "v1", good)
	layers, _ := good.Layers()
	ld, _ := layers[0].Digest()
	// Replace the layer blob and rename it to its new digest, fixing up
	// the manifest: the config's diff_id still names the old content.
	evil := imagetest.Gzip(t, imagetest.NewTar(t).File("a", "evil", 0o644).Bytes())
	sum := sha256.Sum256(evil)
	newHex := hex.EncodeToString(sum[:])
	blobs := filepath.Join(dir, "blobs", "sha256")
	if err := os.WriteFile(filepath.Join(blobs, newHex), evil, 0o644); err != nil {
		t.Fatal(err)
	}
	md, _ := good.Digest()
	raw, _ := good.RawManifest()
	lsz, _ := layers[0].Size()
	raw = bytes.ReplaceAll(raw, []byte(ld.Hex), []byte(newHex))
	raw = bytes.Replace(raw, []byte(`"size":`+itoa(lsz)), []byte(`"size":`+itoa(int64(len(evil)))), 1)
	msum := sha256.Sum256(raw)
	mhex := hex.EncodeToString(msum[:])
	if err := os.WriteFile(filepath.Join(blobs, mhex), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	idx, _ := os.ReadFile(filepath.Join(dir, "index.json"))
	idx = bytes.ReplaceAll(idx, []byte(md.Hex), []byte(mhex))
	idx = bytes.Replace(idx, []byte(`"size":`+itoa(int64(len(mustRaw(t, good))))), []byte(`"size":`+itoa(int64(len(raw)))), 1)
	if err := os.WriteFile(filepath.Join(dir, "index.json"), idx, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := e.store.Get(context.Background(), "oci:"+dir+":v1", PullOptions{})
	if !errors.Is(err, ErrDigestMismatch) || !strings.Contains(err.Error(), "config says") {
		t.Fatalf("err = %v; want ErrDigestMismatch from the diff_id check", err)
	}
	e.checkNothingPublished(t)
}

func mustRaw(t testing.TB, img interface{ RawManifest() ([]byte, error) }) []byte {
	raw, err := img.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func itoa(n int64) string {
	var b [20]byte
	i := len(b)
	if n == 0 {
		return "0"
	}
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}
