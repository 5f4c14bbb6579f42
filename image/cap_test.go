package image

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/image/imagetest"
)

// pushSized pushes an image of one file of n bytes (distinct per tag).
func pushSized(t *testing.T, host, tag string, n int) string {
	t.Helper()
	dir := sampleRootfs(t)
	imagetest.WriteTree(t, dir, map[string]string{"data": tag + strings.Repeat("x", n)})
	return imagetest.PushDir(t, host, "test/app", tag, dir)
}

func imageSizeOf(t *testing.T, s *Store, digest string) int64 {
	t.Helper()
	idx, err := s.readIndexLocked()
	if err != nil {
		t.Fatal(err)
	}
	return s.imageSize(idx.Images[digest])
}

func present(s *Store, img *Image) bool {
	_, err := os.Stat(img.Rootfs)
	return err == nil
}

// Past the cap, a new image makes the store drop the least recently used
// images, references and blobs with them, until it is under the cap; the
// images in use (held by a run or a pooled sandbox) are skipped, and the
// new one is never dropped.
func TestStoreCapDropsLeastRecentlyUsed(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	s := e.store
	host := imagetest.Registry(t)
	const n = 256 << 10
	var imgs []*Image
	for _, tag := range []string{"a", "b", "c"} {
		pushSized(t, host, tag, n)
		img, err := s.Get(ctx, host+"/test/app:"+tag, PullOptions{})
		if err != nil {
			t.Fatal(err)
		}
		imgs = append(imgs, img)
	}
	a, b, c := imgs[0], imgs[1], imgs[2]
	one := imageSizeOf(t, s, a.Digest)
	if one < n {
		t.Fatalf("image size %d; want at least %d", one, n)
	}
	// Use a again: b is now the least recently used. a is released, b and
	// c are still held.
	a.Release()
	again, err := s.Get(ctx, host+"/test/app:a", PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	again.Release()

	// Under a cap of two images, with everything in use but a: a goes,
	// though it is not the least recently used, because b and c are held.
	if removed, err := s.Shrink(2*one + one/2); err != nil || len(removed) != 1 || removed[0].Digest != a.Digest {
		t.Fatalf("Shrink with b and c held: removed %+v, %v; want a only", removed, err)
	}
	if present(s, a) || !present(s, b) || !present(s, c) {
		t.Fatalf("after Shrink: a %v b %v c %v; want a gone", present(s, a), present(s, b), present(s, c))
	}
	if _, err := s.Hold(a); !errors.Is(err, ErrNotFound) {
		t.Errorf("Hold of a removed image: %v", err)
	}

	// The cap applies by itself after each pull that adds an image. All
	// released, one image fits: a new d evicts b and c (least recently
	// used first) and stays itself.
	b.Release()
	c.Release()
	s.MaxTotal = one + one/2
	pushSized(t, host, "d", n)
	d, err := s.Get(ctx, host+"/test/app:d", PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Release()
	if present(s, b) || present(s, c) || !present(s, d) {
		t.Fatalf("after the pull of d under the cap: b %v c %v d %v", present(s, b), present(s, c), present(s, d))
	}
	l, _ := s.List()
	if len(l) != 1 || l[0].Digest != d.Digest {
		t.Errorf("List = %+v; want d only", l)
	}
	if total, _ := storeTotal(s); total > s.MaxTotal {
		t.Errorf("total %d over the cap %d", total, s.MaxTotal)
	}
	if n := countDir(t, s.dir+"/blobs/sha256"); n != 3 {
		t.Errorf("%d blobs; want d's 3", n)
	}

	// An image larger than the cap on its own is kept while in use: the
	// run that pulled it runs.
	s.MaxTotal = 1
	pushSized(t, host, "e", n)
	big, err := s.Get(ctx, host+"/test/app:e", PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !present(s, big) || !present(s, d) {
		t.Fatalf("held images removed by the cap: e %v d %v", present(s, big), present(s, d))
	}
	big.Release()
	// A removed image that a reference named is pulled again on its next use.
	if removed, err := s.Shrink(s.MaxTotal); err != nil || len(removed) != 1 {
		t.Fatalf("Shrink after release: %+v %v", removed, err)
	}
	if _, err := os.Stat(big.Rootfs); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("released image survived: %v", err)
	}
	e.checkCanary(t)
}

// A hold taken in another Store (as another agentrun process would) keeps
// the image too: the hold is a file lock.
func TestStoreCapHonoursOtherProcessesHolds(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	host := imagetest.Registry(t)
	pushSized(t, host, "a", 1024)
	other := e.open(t)
	img, err := other.Get(ctx, host+"/test/app:a", PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if removed, err := e.store.Shrink(0); err != nil || len(removed) != 0 {
		t.Fatalf("Shrink with the image held elsewhere: %+v %v", removed, err)
	}
	img.Release()
	if removed, err := e.store.Shrink(0); err != nil || len(removed) != 1 {
		t.Fatalf("Shrink once released: %+v %v", removed, err)
	}
}

// storeTotal is s's size as the cap counts it: each image's rootfs
// and the blobs it lists (a blob two images share counts twice).
func storeTotal(s *Store) (int64, error) {
	idx, err := s.readIndexLocked()
	if err != nil {
		return 0, err
	}
	var total int64
	for _, ie := range idx.Images {
		total += s.imageSize(ie)
	}
	return total, nil
}
