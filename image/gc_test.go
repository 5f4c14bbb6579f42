package image

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentrun/agentrun/image/imagetest"
)

func countDir(t testing.TB, dir string) int {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func TestRemoveAndPrune(t *testing.T) {
	e := newEnv(t)
	s := e.store
	ctx := context.Background()
	host := imagetest.Registry(t)
	// One tree pushed twice: same content, same digest (two trees made
	// apart could differ in their files' mtimes).
	rootfs := sampleRootfs(t)
	d1 := imagetest.PushDir(t, host, "test/app", "v1", rootfs)
	imagetest.PushDir(t, host, "test/app", "latest", rootfs)

	a, err := s.Get(ctx, host+"/test/app:v1", PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Get(ctx, host+"/test/app:latest", PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a.Rootfs != b.Rootfs || a.Digest != d1 {
		t.Fatalf("two tags of one digest: %s vs %s", a.Rootfs, b.Rootfs)
	}
	blobs := filepath.Join(s.dir, "blobs", "sha256")
	if n := countDir(t, blobs); n != 3 {
		t.Fatalf("blobs = %d; want 3 (manifest, config, layer)", n)
	}

	// Removing one tag keeps the image the other uses.
	if err := s.Remove(host + "/test/app:v1"); err != nil {
		t.Fatalf("Remove v1: %v", err)
	}
	if _, err := os.Stat(a.Rootfs); err != nil {
		t.Fatalf("rootfs gone while :latest still uses it: %v", err)
	}
	if err := s.Remove(host + "/test/app:v1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second Remove: err = %v; want ErrNotFound", err)
	}
	if err := s.Remove(host + "/test/app:latest"); err != nil {
		t.Fatalf("Remove latest: %v", err)
	}
	if _, err := os.Stat(a.Rootfs); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("rootfs still there after its last ref went: %v", err)
	}
	if n := countDir(t, blobs); n != 0 {
		t.Fatalf("blobs = %d after Remove; want 0", n)
	}
	if l, _ := s.List(); len(l) != 0 {
		t.Fatalf("List() = %v; want empty", l)
	}

	// Pull re-points a tag; the old image stays until Prune.
	old, err := s.Get(ctx, host+"/test/app:v1", PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	imagetest.WriteTree(t, other, map[string]string{"etc/os-release": "ID=v2\n"})
	d2 := imagetest.PushDir(t, host, "test/app", "v1", other)
	again, _ := s.Get(ctx, host+"/test/app:v1", PullOptions{})
	if again.Digest != d1 {
		t.Fatalf("Get re-resolved a present ref: %s", again.Digest)
	}
	again.Release()
	cur, err := s.Pull(ctx, host+"/test/app:v1", PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cur.Digest != d2 || cur.Rootfs == old.Rootfs {
		t.Fatalf("Pull = %+v; want digest %s", cur, d2)
	}
	if _, err := os.Stat(old.Rootfs); err != nil {
		t.Fatalf("old rootfs removed by Pull (runs may use it): %v", err)
	}
	// A stale staging dir (its pull crashed) and a live one (locked).
	stale := filepath.Join(s.dir, "staging", "crashed")
	imagetest.WriteTree(t, stale, map[string]string{"usr/bin/half": "x"})
	live := filepath.Join(s.dir, "staging", "live")
	if err := os.Mkdir(live, 0o700); err != nil {
		t.Fatal(err)
	}
	lf, _ := os.Open(live)
	defer lf.Close()
	if ok, err := tryLock(lf); !ok || err != nil {
		t.Fatalf("locking live staging: %v", err)
	}

	// While a run holds the old image, Prune leaves it.
	if removed, err := s.Prune(ctx); err != nil || len(removed) != 0 {
		t.Fatalf("Prune with the old image held: removed %v, %v; want nothing", removed, err)
	}
	if _, err := os.Stat(old.Rootfs); err != nil {
		t.Fatalf("held rootfs pruned: %v", err)
	}
	old.Release()
	old.Release() // twice is harmless

	removed, err := s.Prune(ctx)
	if err != nil {
		t.Fatalf("Prune: %v", err)
	}
	if len(removed) != 1 || removed[0].Digest != d1 || removed[0].Size <= 0 {
		t.Fatalf("Prune removed %+v; want the old image %s", removed, d1)
	}
	if _, err := os.Stat(old.Rootfs); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("old rootfs survived Prune: %v", err)
	}
	if _, err := os.Stat(cur.Rootfs); err != nil {
		t.Fatalf("current rootfs pruned: %v", err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stale staging dir survived Prune: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Fatalf("live staging dir pruned: %v", err)
	}
	if n := countDir(t, blobs); n != 3 {
		t.Fatalf("blobs = %d after Prune; want 3 (the current image's)", n)
	}
	if removed, _ := s.Prune(ctx); len(removed) != 0 {
		t.Fatalf("second Prune removed %v; want nothing", removed)
	}
	if err := s.Remove("dir:/"); err == nil {
		t.Fatalf("Remove(dir:/) = nil; want an error")
	}
	e.checkCanary(t)
}

func TestOpenRemovesCrashedStaging(t *testing.T) {
	e := newEnv(t)
	stale := filepath.Join(e.store.dir, "staging", "crashed")
	imagetest.WriteTree(t, stale, map[string]string{"a/b": "x"})
	os.WriteFile(filepath.Join(e.store.dir, "staging", "blob-123"), []byte("half"), 0o600)
	e.open(t)
	if n := countDir(t, filepath.Join(e.store.dir, "staging")); n != 0 {
		t.Fatalf("staging holds %d entries after Open; want 0", n)
	}
}

func TestCancelledPullPublishesNothing(t *testing.T) {
	e := newEnv(t)
	host := imagetest.Registry(t)
	imagetest.PushDir(t, host, "test/app", "v1", sampleRootfs(t))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := e.store.Get(ctx, host+"/test/app:v1", PullOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v; want context.Canceled", err)
	}
	e.checkNothingPublished(t)
}

func TestMountpoints(t *testing.T) {
	e := newEnv(t)
	nt := imagetest.NewTar
	layer := nt(t).
		Symlink("tmp", "var/tmp").Dir("var/tmp/", 0o1777).
		File("proc", "not a dir", 0o644).
		Dir("dev/", 0o700).
		Dir("etc/", 0o755).
		Symlink("etc/resolv.conf", "/run/systemd/resolve/stub-resolv.conf").
		File("etc/hosts", "127.0.0.1 localhost\n", 0o600).
		Bytes()
	host := imagetest.Registry(t)
	imagetest.Push(t, host, "test/mp", "v1", imagetest.Image(t, layer))
	img, err := e.store.Get(context.Background(), host+"/test/mp:v1", PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"proc", "sys", "dev", "tmp", "workspace"} {
		fi, err := os.Lstat(filepath.Join(img.Rootfs, d))
		if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o755 {
			t.Errorf("/%s: %v %v; want a 0755 directory", d, fi.Mode(), err)
		}
	}
	for _, f := range []string{"etc/resolv.conf", "etc/hosts"} {
		fi, err := os.Lstat(filepath.Join(img.Rootfs, f))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 || fi.Size() != 0 {
			t.Errorf("/%s: %v %v; want an empty 0644 file", f, fi.Mode(), err)
		}
	}
	if fi, _ := os.Lstat(filepath.Join(img.Rootfs, "var/tmp")); fi == nil || !fi.IsDir() {
		t.Errorf("var/tmp gone")
	}
	if !HasMountpoints(img.Rootfs) {
		t.Errorf("HasMountpoints = false")
	}

	// No /etc at all: it is created.
	bare := t.TempDir()
	r, err := os.OpenRoot(bare)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if HasMountpoints(bare) {
		t.Fatalf("HasMountpoints(empty dir) = true")
	}
	if err := PrepareMountpoints(r); err != nil {
		t.Fatal(err)
	}
	if !HasMountpoints(bare) {
		t.Fatalf("HasMountpoints after PrepareMountpoints = false")
	}

	// /etc as a symlink out of the tree is refused, not followed.
	evil := t.TempDir()
	os.Symlink(e.outside, filepath.Join(evil, "etc"))
	r2, _ := os.OpenRoot(evil)
	defer r2.Close()
	if err := PrepareMountpoints(r2); err == nil {
		t.Fatalf("PrepareMountpoints with /etc -> outside: want an error")
	}
	e.checkCanary(t)
}

// BenchmarkPullUnpack pulls and unpacks a ~30 MB image from the
// in-process registry into a fresh store each iteration.
func BenchmarkPullUnpack(b *testing.B) {
	src := b.TempDir()
	var total int64
	for i := range 30 {
		data := make([]byte, 1<<20)
		rand.Read(data[:len(data)/2]) // half random: compresses about 2:1
		p := filepath.Join(src, fmt.Sprintf("usr/lib/d%d/f%d.bin", i%5, i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			b.Fatal(err)
		}
		total += int64(len(data))
	}
	host := imagetest.Registry(b)
	imagetest.PushDir(b, host, "bench/img", "v1", src)
	b.SetBytes(total)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		s, err := Open(filepath.Join(b.TempDir(), "store"))
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if _, err := s.Get(context.Background(), host+"/bench/img:v1", PullOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}
