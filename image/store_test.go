package image

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/agentrun/agentrun/image/imagetest"
	"github.com/agentrun/agentrun/test/testenv"
)

func TestMain(m *testing.M) {
	// Keep the host's registry credentials out of the tests.
	dir, err := os.MkdirTemp("", "agentrun-docker-config-")
	if err != nil {
		panic(err)
	}
	os.Setenv("DOCKER_CONFIG", dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// env is a store next to a canary tree no image may change.
type env struct {
	base, outside string
	store         *Store
	before        string
}

func newEnv(t testing.TB) *env {
	t.Helper()
	base := t.TempDir()
	e := &env{base: base, outside: filepath.Join(base, "outside")}
	imagetest.WriteTree(t, e.outside, map[string]string{"passwd": "canary\n", "etc/passwd": "canary\n", "x": "x\n"})
	e.before = imagetest.HashTree(t, e.outside)
	e.store = e.open(t)
	return e
}

func (e *env) open(t testing.TB) *Store {
	t.Helper()
	s, err := Open(filepath.Join(e.base, "store"))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	s.RetryWait = time.Millisecond
	return s
}

func (e *env) checkCanary(t testing.TB) {
	t.Helper()
	if got := imagetest.HashTree(t, e.outside); got != e.before {
		t.Fatalf("canary tree outside the store changed")
	}
	ents, _ := os.ReadDir(e.base)
	for _, ent := range ents {
		if ent.Name() != "outside" && ent.Name() != "store" {
			t.Fatalf("something wrote %q next to the store", ent.Name())
		}
	}
	for _, p := range []string{"/etc/agentrun-canary", "/agentrun-canary"} {
		if _, err := os.Lstat(p); err == nil {
			os.Remove(p)
			t.Fatalf("something wrote %s", p)
		}
	}
}

// checkNothingPublished fails if a rootfs, ref or staging entry exists.
func (e *env) checkNothingPublished(t testing.TB) {
	t.Helper()
	for _, d := range []string{"rootfs/sha256", "staging"} {
		ents, err := os.ReadDir(filepath.Join(e.store.dir, d))
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) != 0 {
			t.Fatalf("%s holds %d entries after a failed pull; want 0", d, len(ents))
		}
	}
	if l, _ := e.store.List(); len(l) != 0 {
		t.Fatalf("List() = %v after a failed pull; want empty", l)
	}
}

func sampleRootfs(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	imagetest.WriteTree(t, dir, map[string]string{
		"bin/hello":       "#!/bin/sh\necho hello\n",
		"etc/os-release":  "ID=agentrun-test\n",
		"usr/lib/libx.so": strings.Repeat("x", 4096),
		"var/empty/":      "",
	})
	if err := os.Symlink("/run/resolv.conf", filepath.Join(dir, "etc/resolv.conf")); err != nil {
		t.Fatal(err)
	}
	return dir
}

func readFile(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func checkRootfs(t testing.TB, img *Image) {
	t.Helper()
	if got := readFile(t, filepath.Join(img.Rootfs, "etc/os-release")); got != "ID=agentrun-test\n" {
		t.Fatalf("etc/os-release = %q", got)
	}
	if !HasMountpoints(img.Rootfs) {
		t.Fatalf("HasMountpoints(%s) = false", img.Rootfs)
	}
	fi, err := os.Stat(img.Rootfs)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o755 {
		t.Fatalf("rootfs mode = %v; want 0755", fi.Mode().Perm())
	}
	if !filepath.IsAbs(img.Rootfs) {
		t.Fatalf("Rootfs %q is not absolute", img.Rootfs)
	}
}

func TestPullByTagAndDigest(t *testing.T) {
	e := newEnv(t)
	host := imagetest.Registry(t)
	digest := imagetest.PushDir(t, host, "test/app", "v1", sampleRootfs(t))
	ctx := context.Background()

	img, err := e.store.Get(ctx, host+"/test/app:v1", PullOptions{})
	if err != nil {
		t.Fatalf("Get by tag: %v", err)
	}
	if img.Digest != digest {
		t.Fatalf("Digest = %s; want %s", img.Digest, digest)
	}
	if img.Ref != host+"/test/app:v1" {
		t.Fatalf("Ref = %q", img.Ref)
	}
	checkRootfs(t, img)

	var progress strings.Builder
	byDigest, err := e.store.Get(ctx, host+"/test/app@"+digest, PullOptions{Progress: &progress})
	if err != nil {
		t.Fatalf("Get by digest: %v", err)
	}
	if byDigest.Rootfs != img.Rootfs || byDigest.Digest != digest {
		t.Fatalf("Get by digest = %+v; want rootfs %s", byDigest, img.Rootfs)
	}
	if !strings.Contains(progress.String(), "already unpacked") {
		t.Errorf("progress = %q; want it to say the image was already unpacked", progress.String())
	}
	fi, _ := os.Stat(e.store.dir)
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("store dir mode = %v; want 0700", fi.Mode().Perm())
	}
	list, err := e.store.List()
	if err != nil || len(list) != 2 {
		t.Fatalf("List() = %v, %v; want 2 entries", list, err)
	}
	for _, ent := range list {
		if ent.Digest != digest || ent.Size <= 4096 || ent.LastUsed.IsZero() {
			t.Errorf("entry %+v; want digest %s, size > 4096, last used set", ent, digest)
		}
	}
	e.checkCanary(t)
}

func TestSecondGetDoesNoWork(t *testing.T) {
	e := newEnv(t)
	host := imagetest.Registry(t)
	imagetest.PushDir(t, host, "test/app", "v1", sampleRootfs(t))
	ref := host + "/test/app:v1"
	ctx := context.Background()
	first, err := e.store.Get(ctx, ref, PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st1 := statT(t, first.Rootfs)
	l1, _ := e.store.List()
	time.Sleep(10 * time.Millisecond)

	// Another Store on the same dir, as another process would be.
	second, err := e.open(t).Get(ctx, ref, PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if second.Rootfs != first.Rootfs {
		t.Fatalf("rootfs = %s; want %s", second.Rootfs, first.Rootfs)
	}
	st2 := statT(t, second.Rootfs)
	if st1.Ino != st2.Ino || st1.Mtim != st2.Mtim || st1.Ctim != st2.Ctim {
		t.Fatalf("rootfs changed on second Get: inode %d->%d", st1.Ino, st2.Ino)
	}
	l2, _ := e.store.List()
	if !l2[0].LastUsed.After(l1[0].LastUsed) {
		t.Fatalf("LastUsed not updated: %v then %v", l1[0].LastUsed, l2[0].LastUsed)
	}
}

func statT(t testing.TB, p string) *syscall.Stat_t {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t)
}

func TestConcurrentFirstGetsUnpackOnce(t *testing.T) {
	e := newEnv(t)
	var manifestGets atomic.Int64
	host := imagetest.RegistryWith(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/manifests/") {
				manifestGets.Add(1)
			}
			h.ServeHTTP(w, r)
		})
	})
	imagetest.PushDir(t, host, "test/app", "v1", sampleRootfs(t))
	ref := host + "/test/app:v1"

	const n = 8
	stores := []*Store{e.store}
	for i := 1; i < n; i++ {
		stores = append(stores, e.open(t)) // separate Stores: like separate processes
	}
	var wg sync.WaitGroup
	imgs := make([]*Image, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			imgs[i], errs[i] = stores[i].Get(context.Background(), ref, PullOptions{})
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("Get %d: %v", i, errs[i])
		}
		if imgs[i].Rootfs != imgs[0].Rootfs {
			t.Fatalf("Get %d rootfs %s; want %s", i, imgs[i].Rootfs, imgs[0].Rootfs)
		}
	}
	if got := manifestGets.Load(); got != 1 {
		t.Errorf("manifest fetched %d times; want 1 (the others waited on the ref lock)", got)
	}
	checkRootfs(t, imgs[0])
}

func TestLayout(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "layout")
	d1 := imagetest.WriteLayout(t, dir, "v1", sampleRootfs(t))

	img, err := e.store.Get(ctx, "oci:"+dir, PullOptions{})
	if err != nil {
		t.Fatalf("Get untagged single-image layout: %v", err)
	}
	if img.Digest != d1 {
		t.Fatalf("Digest = %s; want %s", img.Digest, d1)
	}
	checkRootfs(t, img)

	other := t.TempDir()
	imagetest.WriteTree(t, other, map[string]string{"etc/os-release": "ID=other\n"})
	d2 := imagetest.WriteLayout(t, dir, "v2", other)
	img2, err := e.store.Get(ctx, "oci:"+dir+":v2", PullOptions{})
	if err != nil {
		t.Fatalf("Get oci:layout:v2: %v", err)
	}
	if img2.Digest != d2 || readFile(t, filepath.Join(img2.Rootfs, "etc/os-release")) != "ID=other\n" {
		t.Fatalf("oci:layout:v2 gave %+v", img2)
	}
	if _, err := e.store.Pull(ctx, "oci:"+dir, PullOptions{}); !errors.Is(err, ErrBadReference) {
		t.Fatalf("Pull of ambiguous layout: err = %v; want ErrBadReference", err)
	}
	if _, err := e.store.Get(ctx, "oci:"+dir+":nope", PullOptions{}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of missing tag: err = %v; want ErrNotFound", err)
	}
	if _, err := e.store.Get(ctx, "oci:"+filepath.Join(dir, "missing"), PullOptions{}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of missing layout: err = %v; want ErrNotFound", err)
	}
}

func TestDockerArchive(t *testing.T) {
	e := newEnv(t)
	p := filepath.Join(t.TempDir(), "app.tar")
	imagetest.WriteDockerArchive(t, p, "example.com/app:1", sampleRootfs(t))
	img, err := e.store.Get(context.Background(), "docker-archive:"+p, PullOptions{})
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	checkRootfs(t, img)
	if !strings.HasPrefix(img.Digest, "sha256:") {
		t.Fatalf("Digest = %q", img.Digest)
	}
	if _, err := e.store.Get(context.Background(), "docker-archive:"+p+".missing", PullOptions{}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing archive: err = %v; want ErrNotFound", err)
	}
}

func TestDirReference(t *testing.T) {
	e := newEnv(t)
	dir := sampleRootfs(t)
	img, err := e.store.Get(context.Background(), "dir:"+dir, PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if img.Rootfs != dir || img.Digest != "" {
		t.Fatalf("Get(dir:) = %+v", img)
	}
	if _, err := e.store.Get(context.Background(), "dir:"+dir+"/nope", PullOptions{}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing dir: err = %v; want ErrNotFound", err)
	}
	if _, err := e.store.Get(context.Background(), "dir:"+dir+"/bin/hello", PullOptions{}); err == nil {
		t.Fatalf("dir: naming a file: want an error")
	}
	if l, _ := e.store.List(); len(l) != 0 {
		t.Fatalf("dir: reference was stored: %v", l)
	}
}

func TestRegistryErrors(t *testing.T) {
	ctx := context.Background()
	t.Run("not found", func(t *testing.T) {
		e := newEnv(t)
		host := imagetest.Registry(t)
		imagetest.PushDir(t, host, "test/app", "v1", sampleRootfs(t))
		for _, ref := range []string{host + "/test/app:v2", host + "/test/none:v1",
			host + "/test/app@sha256:" + strings.Repeat("a", 64)} {
			if _, err := e.store.Get(ctx, ref, PullOptions{}); !errors.Is(err, ErrNotFound) {
				t.Errorf("Get(%s): err = %v; want ErrNotFound", ref, err)
			}
		}
	})
	t.Run("bad reference", func(t *testing.T) {
		e := newEnv(t)
		if _, err := e.store.Get(ctx, "UPPER/Case::x", PullOptions{}); !errors.Is(err, ErrBadReference) {
			t.Errorf("err = %v; want ErrBadReference", err)
		}
	})
	t.Run("unauthorized", func(t *testing.T) {
		e := newEnv(t)
		host := imagetest.RegistryWith(t, basicAuth("user", "secret"))
		pushAs(t, host, "user", "secret")
		ref := host + "/test/app:v1"
		if _, err := e.store.Get(ctx, ref, PullOptions{}); !errors.Is(err, ErrUnauthorized) {
			t.Fatalf("anonymous Get: err = %v; want ErrUnauthorized", err)
		}
		writeDockerConfig(t, host, "user", "wrong")
		if _, err := e.store.Get(ctx, ref, PullOptions{}); !errors.Is(err, ErrUnauthorized) {
			t.Fatalf("Get with bad password: err = %v; want ErrUnauthorized", err)
		}
		writeDockerConfig(t, host, "user", "secret")
		img, err := e.store.Get(ctx, ref, PullOptions{})
		if err != nil {
			t.Fatalf("Get with good password: %v", err)
		}
		checkRootfs(t, img)
	})
	t.Run("unreachable", func(t *testing.T) {
		e := newEnv(t)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close() // nothing listens there now: connection refused
		start := time.Now()
		_, err = e.store.Get(ctx, addr+"/test/app:v1", PullOptions{})
		if !errors.Is(err, ErrUnreachable) {
			t.Fatalf("err = %v; want ErrUnreachable", err)
		}
		if !strings.Contains(err.Error(), "after 4 attempts") {
			t.Errorf("err = %v; want it to say 4 attempts were made", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("gave up after %v; want quick retries in tests", d)
		}
	})
	t.Run("transient 503 then success", func(t *testing.T) {
		e := newEnv(t)
		var fails atomic.Int64
		fails.Store(2)
		var tries, blobFails atomic.Int64
		host := imagetest.RegistryWith(t, func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/manifests/") {
					tries.Add(1)
					if fails.Add(-1) >= 0 {
						http.Error(w, "try later", http.StatusServiceUnavailable)
						return
					}
				}
				if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") && blobFails.Add(-1) >= 0 {
					http.Error(w, "oops", http.StatusBadGateway)
					return
				}
				h.ServeHTTP(w, r)
			})
		})
		imagetest.PushDir(t, host, "test/app", "v1", sampleRootfs(t))
		tries.Store(0)
		fails.Store(2)
		blobFails.Store(2) // the config, then the layer, each fail once or twice
		var progress strings.Builder
		if _, err := e.store.Get(ctx, host+"/test/app:v1", PullOptions{Progress: &progress}); err != nil {
			t.Fatalf("Get: %v", err)
		}
		if got := tries.Load(); got != 3 {
			t.Errorf("manifest tries = %d; want 3", got)
		}
		t.Logf("progress:\n%s", progress.String())
		fails.Store(100)
		if _, err := e.store.Pull(ctx, host+"/test/app:v1", PullOptions{}); !errors.Is(err, ErrUnreachable) {
			t.Errorf("Pull against a failing registry: err = %v; want ErrUnreachable", err)
		}
	})
	t.Run("platform", func(t *testing.T) {
		e := newEnv(t)
		host := imagetest.Registry(t)
		other := v1.Platform{OS: "linux", Architecture: "s390x"}
		imagetest.Push(t, host, "test/app", "s390x", imagetest.ImageFor(t, other, imagetest.TarDir(t, sampleRootfs(t))))
		if _, err := e.store.Get(ctx, host+"/test/app:s390x", PullOptions{}); !errors.Is(err, ErrPlatform) {
			t.Fatalf("Get of s390x image: err = %v; want ErrPlatform", err)
		}
		img, err := e.store.Get(ctx, host+"/test/app:s390x", PullOptions{Platform: &other})
		if err != nil {
			t.Fatalf("Get with platform s390x: %v", err)
		}
		checkRootfs(t, img)

		// A multi-platform index: the host's platform is picked.
		native := imagetest.DirImage(t, sampleRootfs(t))
		foreign := imagetest.ImageFor(t, other, imagetest.TarDir(t, t.TempDir()))
		idx := mutate.AppendManifests(empty.Index,
			mutate.IndexAddendum{Add: foreign, Descriptor: v1.Descriptor{Platform: &other}},
			mutate.IndexAddendum{Add: native, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}}})
		tag, _ := name.NewTag(host + "/test/multi:v1")
		if err := remote.WriteIndex(tag, idx); err != nil {
			t.Fatal(err)
		}
		img, err = e.store.Get(ctx, tag.String(), PullOptions{})
		if err != nil {
			t.Fatalf("Get of index: %v", err)
		}
		if want, _ := native.Digest(); img.Digest != want.String() {
			t.Fatalf("index resolved to %s; want the native image %s", img.Digest, want)
		}
		mips := v1.Platform{OS: "linux", Architecture: "mips64le"}
		if _, err := e.store.Pull(ctx, tag.String(), PullOptions{Platform: &mips}); !errors.Is(err, ErrPlatform) {
			t.Fatalf("Pull of index for mips64le: err = %v; want ErrPlatform", err)
		}
	})
}

func basicAuth(user, pass string) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u, p, ok := r.BasicAuth(); !ok || u != user || p != pass {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
				return
			}
			h.ServeHTTP(w, r)
		})
	}
}

func writeDockerConfig(t testing.TB, host, user, pass string) {
	t.Helper()
	dir := t.TempDir()
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	cfg := fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, host, auth)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_CONFIG", dir)
}

func pushAs(t testing.TB, host, user, pass string) {
	t.Helper()
	writeDockerConfig(t, host, user, pass)
	imagetest.PushDir(t, host, "test/app", "v1", sampleRootfs(t))
	t.Setenv("DOCKER_CONFIG", t.TempDir())
}

// A full disk fails the index's write and leaves the index as it was: the
// write goes to a temporary file that replaces the index only when whole.
func TestIndexWriteOnFullDiskKeepsTheOld(t *testing.T) {
	testenv.RequireRoot(t) // it mounts a small tmpfs
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatalf("mounting tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	s, err := Open(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	entry := func(i int) *refEntry {
		return &refEntry{Ref: fmt.Sprintf("registry.test/img:%d", i), Digest: "sha256:" + strings.Repeat("a", 64)}
	}
	old := &index{Refs: map[string]*refEntry{"registry.test/img:0": entry(0)}, Images: map[string]*imageEntry{}}
	if err := s.writeIndex(old); err != nil {
		t.Fatalf("first index: %v", err)
	}
	want, err := os.ReadFile(s.indexPath())
	if err != nil {
		t.Fatal(err)
	}
	// Fill the disk, then ask for an index larger than what is left.
	fill, err := os.Create(filepath.Join(dir, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	for err == nil {
		_, err = fill.Write(make([]byte, 4096))
	}
	fill.Close()
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("filling the disk: %v", err)
	}
	bigger := &index{Refs: map[string]*refEntry{}, Images: map[string]*imageEntry{}}
	for i := range 200 {
		e := entry(i)
		bigger.Refs[e.Ref] = e
	}
	if err := s.writeIndex(bigger); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("writeIndex on a full disk: %v, want ENOSPC", err)
	}
	got, err := os.ReadFile(s.indexPath())
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("index after a failed write:\n%s\nwant the one before:\n%s", got, want)
	}
	if left, _ := filepath.Glob(filepath.Join(s.dir, ".refs-*")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}
