package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/image"
	"github.com/agentrun/agentrun/image/imagetest"
	"github.com/agentrun/agentrun/internal/compose"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/task"
)

// Under a store cap smaller than any image, every pull drops the least
// recently used images, but never one in use: the image of a pooled
// sandbox, nor that of a run going on, which reads its rootfs after the
// prune; once released, an image goes at the next pull.
func TestStoreCapNeverRemovesImagesInUse(t *testing.T) {
	cfg := testConfig(t)
	cfg.StoreDir = newStoreDir(t)
	cfg.StoreMax = config.MustSize("1k")
	r, err := compose.Runner(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	pooledRef := "oci:" + busyboxLayout() + ":latest"
	pool := r.NewPool(map[string]int{pooledRef: 1})
	r.UsePool(pool)
	t.Cleanup(func() {
		if err := pool.Close(); err != nil {
			t.Errorf("closing pool: %v", err)
		}
		assertNoLeaks(t)
	})
	plan := func(taskJSON string) *task.Plan {
		t.Helper()
		p, err := task.Load([]byte(taskJSON), cfg)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if err := pool.Seed(context.Background(), plan(echo45(pooledRef))); err != nil {
		t.Fatal(err)
	}
	waitReady(t, pool, pooledRef, 1)

	// A python run that reads its image's files after the others pulled.
	pyRef := "oci:" + pythonLayout() + ":latest"
	done := make(chan *result.Result, 1)
	go func() {
		done <- r.Run(context.Background(), plan(pyTask(
			"import time\ntime.sleep(3)\nprint(len(open('/usr/bin/python3','rb').read()) > 0)",
			map[string]any{"image": pyRef, "limits": map[string]any{"timeout": "20s"}})), runapi.Hooks{})

	}()
	deadline := time.Now().Add(30 * time.Second)
	for len(storeList(t, cfg.StoreDir)) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the python image never reached the store: %+v", storeList(t, cfg.StoreDir))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A third image comes in, under a cap that none fits.
	archive := filepath.Join(t.TempDir(), "busybox.tar")
	imagetest.WriteDockerArchive(t, archive, "example/busybox:1", strings.TrimPrefix(busyboxImage, "dir:"))
	third := r.Run(context.Background(), plan(echo45("docker-archive:"+archive)), runapi.Hooks{})
	if third.Error != "" || third.Stdout != "45\n" {
		t.Fatalf("third image: error %q stdout %q", third.Error, third.Stdout)
	}
	py := <-done
	if py.Error != "" || py.Stdout != "True\n" {
		t.Fatalf("the python run lost its image: error %q stdout %q stderr %q", py.Error, py.Stdout, py.Stderr)
	}
	refs := map[string]string{}
	for _, e := range storeList(t, cfg.StoreDir) {
		refs[e.Ref] = e.Digest
	}
	if refs[pooledRef] == "" || refs[pyRef] == "" {
		t.Fatalf("store lists %v; want the pooled and the running image kept", refs)
	}
	before := pool.Stats().Hits
	if res := r.Run(context.Background(), plan(echo45(pooledRef)), runapi.Hooks{}); res.Error != "" || res.Stdout != "45\n" || pool.Stats().Hits != before+1 {
		t.Fatalf("pooled run after the prune: error %q stdout %q hits %d -> %d", res.Error, res.Stdout, before, pool.Stats().Hits)
	}

	// Released, the python image is the least recently used one, and goes
	// at the next pull; the pooled image stays.
	// (Here the next pull is another process's, as `agentrun pull` or
	// another agentrun's run would be.)
	other, err := image.Open(cfg.StoreDir)
	if err != nil {
		t.Fatal(err)
	}
	other.MaxTotal = 1024
	tree, layoutDir := t.TempDir(), t.TempDir()
	imagetest.WriteTree(t, tree, map[string]string{"etc/os-release": "ID=fourth\n"})
	imagetest.WriteLayout(t, layoutDir, "x", tree)
	img, err := other.Get(context.Background(), "oci:"+layoutDir+":x", image.PullOptions{})
	if err != nil {
		t.Fatalf("fourth image: %v", err)
	}
	img.Release()
	refs = map[string]string{}
	for _, e := range storeList(t, cfg.StoreDir) {
		refs[e.Ref] = e.Digest
	}
	if refs[pyRef] != "" || refs[pooledRef] == "" {
		t.Errorf("store lists %v; want the python image gone, the pooled one kept", refs)
	}
	rootfs, _ := storeState(t, cfg.StoreDir)
	if _, err := os.Stat(filepath.Join(cfg.StoreDir, "rootfs", "sha256", hexOf(py.ImageDigest))); err == nil {
		t.Errorf("python rootfs still there: %v", rootfs)
	}
}
