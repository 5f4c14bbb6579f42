// Package images tests build.sh, the builder of the test images.
package images

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/test/testenv"
)

// builds is how many builds of one image run at once.
const builds = 3

// buildAtOnce runs build.sh busybox, builds times at once, on the images
// directory out, and fails t unless every one succeeds.
func buildAtOnce(t *testing.T, out string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	outputs := make([][]byte, builds)
	errs := make([]error, builds)
	for i := range builds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.CommandContext(ctx, filepath.Join(testenv.RepoRoot(), "test", "images", "build.sh"), "busybox")
			cmd.Env = append(os.Environ(), "AGENTRUN_IMAGES="+out)
			outputs[i], errs[i] = cmd.CombinedOutput()
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("build %d of %d at once: %v\n%s", i+1, builds, err, outputs[i])
		}
	}
}

// checkComplete fails t unless out holds a whole busybox image, and
// nothing else but its lock.
func checkComplete(t *testing.T, out string) {
	t.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatal(err)
	}
	host, err := os.Stat(bb)
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(out, "busybox", "rootfs")
	if fi, err := os.Lstat(filepath.Join(root, "bin", "busybox")); err != nil || !fi.Mode().IsRegular() || fi.Size() != host.Size() {
		t.Errorf("rootfs/bin/busybox: %v, %v; want a copy of %s", fi, err, bb)
	}
	if link, err := os.Readlink(filepath.Join(root, "bin", "sh")); err != nil || link != "busybox" {
		t.Errorf("rootfs/bin/sh: %q, %v; want a link to busybox", link, err)
	}
	if passwd, err := os.ReadFile(filepath.Join(root, "etc", "passwd")); err != nil || !strings.Contains(string(passwd), "nobody:") {
		t.Errorf("rootfs/etc/passwd: %q, %v", passwd, err)
	}
	for _, f := range []string{"rootfs/etc/resolv.conf", "rootfs/workspace", "oci/oci-layout", "oci/index.json", ".stamp"} {
		if _, err := os.Stat(filepath.Join(out, "busybox", f)); err != nil {
			t.Errorf("the image lacks %s: %v", f, err)
		}
	}
	ents, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != ".busybox.lock busybox" {
		t.Errorf("the images directory holds %q; want the image and its lock alone", names)
	}
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// Builds of one image at once all succeed, and leave it whole: the
// first builds it, the others wait for it and find it fresh; an image
// whose recipe changed is replaced whole, and one that is fresh is kept.
func TestBuildsAtOnce(t *testing.T) {
	out := t.TempDir()
	buildAtOnce(t, out)
	checkComplete(t, out)
	if t.Failed() {
		t.FailNow()
	}

	image := filepath.Join(out, "busybox")
	stamp := filepath.Join(image, ".stamp")
	if err := os.WriteFile(stamp, []byte("an older recipe\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := inode(t, image)
	buildAtOnce(t, out)
	checkComplete(t, out)
	rebuilt := inode(t, image)
	if rebuilt == before {
		t.Errorf("an image of an older recipe was not replaced")
	}
	if s, _ := os.ReadFile(stamp); string(s) == "an older recipe\n" {
		t.Errorf("the replaced image kept the old stamp")
	}

	buildAtOnce(t, out)
	checkComplete(t, out)
	if inode(t, image) != rebuilt {
		t.Errorf("a fresh image was built again")
	}
}
