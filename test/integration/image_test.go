package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/agentrun/agentrun/image"
	"github.com/agentrun/agentrun/image/imagetest"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/endpoint"
	"github.com/agentrun/agentrun/internal/result"
)

// These tests run images through the store: pulled from a registry (an
// in-process one and Debian's docker-registry), read from an OCI layout
// or a docker archive, unpacked once and shared by every run.

// busyboxLayout and pythonLayout are the OCI layouts test/images/build.sh
// writes next to each rootfs, tagged "latest".
func busyboxLayout() string { return filepath.Join(*imagesDir, "busybox", "oci") }
func pythonLayout() string  { return filepath.Join(*imagesDir, "python", "oci") }

// echo45 is a busybox task printing 45.
func echo45(ref string) string {
	return fmt.Sprintf(`{"image":%q,"command":["/bin/sh","-c","echo 45"]}`, ref)
}

// newStoreDir makes an empty image store directory for one test, under the
// state dir, removed at cleanup.
func newStoreDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp(stateDir, "store-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// storeConfig is testConfig with a store of the test's own.
func storeConfig(t testing.TB) *config.Config {
	t.Helper()
	cfg := testConfig(t)
	cfg.StoreDir = newStoreDir(t)
	return cfg
}

// layoutImage reads the image tagged tag from the OCI layout at dir.
func layoutImage(t testing.TB, dir, tag string) v1.Image {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatalf("opening layout %s (test/images/build.sh writes it): %v", dir, err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range im.Manifests {
		if m.Annotations["org.opencontainers.image.ref.name"] == tag {
			img, err := p.Image(m.Digest)
			if err != nil {
				t.Fatal(err)
			}
			return img
		}
	}
	t.Fatalf("no image tagged %q in %s", tag, dir)
	return nil
}

// storeState lists the unpacked rootfs digests (hex) and the staging
// entries of the store at dir.
func storeState(t testing.TB, dir string) (rootfs, staging []string) {
	t.Helper()
	for _, sub := range []struct {
		path string
		out  *[]string
	}{{"rootfs/sha256", &rootfs}, {"staging", &staging}} {
		ents, err := os.ReadDir(filepath.Join(dir, sub.path))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			*sub.out = append(*sub.out, e.Name())
		}
	}
	return rootfs, staging
}

// storeList is Store.List of the store at dir.
func storeList(t testing.TB, dir string) []image.Entry {
	t.Helper()
	s, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// assertStoreEmpty fails unless the store at dir holds no reference,
// rootfs or staging entry.
func assertStoreEmpty(t testing.TB, dir string) {
	t.Helper()
	rootfs, staging := storeState(t, dir)
	if len(rootfs) != 0 || len(staging) != 0 {
		t.Errorf("store not empty: rootfs %v staging %v", rootfs, staging)
	}
	if l := storeList(t, dir); len(l) != 0 {
		t.Errorf("store lists %+v", l)
	}
}

func hexOf(digest string) string { return strings.TrimPrefix(digest, "sha256:") }

// mustParseRegistry is endpoint.ParseRegistry of an entry known to be good.
func mustParseRegistry(t testing.TB, s string) endpoint.Registry {
	t.Helper()
	r, err := endpoint.ParseRegistry(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// startDistribution runs Debian's docker-registry (distribution 2.8) on a
// free loopback port with its storage in a temp dir, and returns its
// host:port. It is stopped at cleanup. The package's own service and
// config are not used.
func startDistribution(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		t.Fatalf("docker-registry (Debian's distribution registry) is not installed; test/deps.sh installs it (apt-get install docker-registry): %v", err)
	}
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	conf := fmt.Sprintf(`version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
`, filepath.Join(dir, "data"), addr)
	confPath := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "registry.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, "serve", confPath)
	cmd.Env = []string{"PATH=/usr/bin:/bin"} // no REGISTRY_* overrides from the caller
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting docker-registry: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := client.Get("http://" + addr + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return addr
			}
		}
		select {
		case err := <-exited:
			exited <- err
			b, _ := os.ReadFile(logPath)
			t.Fatalf("docker-registry exited: %v\n%s", err, b)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logPath)
			t.Fatalf("docker-registry did not answer on %s/v2/ within 15s (last error %v)\n%s", addr, err, b)
		}
	}
}

// A python image pushed to a registry runs by tag, then by digest without
// a second unpack, from go-containerregistry's in-process registry and
// from a real distribution registry.
func TestPullRegistryPython(t *testing.T) {
	img := layoutImage(t, pythonLayout(), "latest")
	for _, reg := range []struct {
		name  string
		start func(testing.TB) string
	}{{"in-process", imagetest.Registry}, {"distribution", startDistribution}} {
		t.Run(reg.name, func(t *testing.T) {
			host := reg.start(t)
			digest := imagetest.Push(t, host, "agentrun/python", "3", img)
			cfg := storeConfig(t)
			cfg.Policy.Registries = []endpoint.Registry{mustParseRegistry(t, host)}
			for _, ref := range []string{host + "/agentrun/python:3", host + "/agentrun/python@" + digest} {
				res := runTaskWith(t, cfg, nil, pyTask("print(45)", map[string]any{"image": ref}))
				if res.Stdout != "45\n" || res.ExitCode != 0 {
					t.Errorf("%s: exit %d stdout %q stderr %q", ref, res.ExitCode, res.Stdout, res.Stderr)
				}
				if res.Image != ref || res.ImageDigest != digest {
					t.Errorf("%s: result image %q digest %q; want digest %s", ref, res.Image, res.ImageDigest, digest)
				}
			}
			rootfs, staging := storeState(t, cfg.StoreDir)
			if !slices.Equal(rootfs, []string{hexOf(digest)}) || len(staging) != 0 {
				t.Errorf("store holds rootfs %v staging %v; want one rootfs %s", rootfs, staging, digest)
			}
			l := storeList(t, cfg.StoreDir)
			if len(l) != 2 || l[0].Digest != digest || l[1].Digest != digest {
				t.Errorf("store lists %+v; want the tag and the digest reference, both %s", l, digest)
			}
		})
	}
}

// The OCI layout build.sh writes runs; a second run (here on runsc) does
// no unpack work: the rootfs is the same directory, untouched.
func TestImageFromOCILayoutUnpacksOnce(t *testing.T) {
	cfg := storeConfig(t)
	ref := "oci:" + busyboxLayout() + ":latest"
	res := runTaskWith(t, cfg, nil, echo45(ref))
	if res.Stdout != "45\n" || !strings.HasPrefix(res.ImageDigest, "sha256:") {
		t.Fatalf("first run: stdout %q stderr %q digest %q", res.Stdout, res.Stderr, res.ImageDigest)
	}
	rootfs := filepath.Join(cfg.StoreDir, "rootfs", "sha256", hexOf(res.ImageDigest))
	stat := func() (dirIno, binIno uint64, mtime time.Time) {
		t.Helper()
		fi, err := os.Stat(rootfs)
		if err != nil {
			t.Fatal(err)
		}
		bi, err := os.Lstat(filepath.Join(rootfs, "bin", "busybox"))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Ino, bi.Sys().(*syscall.Stat_t).Ino, fi.ModTime()
	}
	dirIno, binIno, mtime := stat()
	first := storeList(t, cfg.StoreDir)

	time.Sleep(10 * time.Millisecond) // so that a rewrite would show in mtime and last-used
	second := *cfg
	second.Runtime = config.RuntimeRunsc
	res2 := runTaskWith(t, &second, nil, echo45(ref))
	if res2.Stdout != "45\n" || res2.ImageDigest != res.ImageDigest {
		t.Errorf("second run: stdout %q stderr %q digest %q", res2.Stdout, res2.Stderr, res2.ImageDigest)
	}
	if d2, b2, m2 := stat(); d2 != dirIno || b2 != binIno || !m2.Equal(mtime) {
		t.Errorf("rootfs changed by the second run: inode %d->%d, bin/busybox inode %d->%d, mtime %v->%v", dirIno, d2, binIno, b2, mtime, m2)
	}
	l := storeList(t, cfg.StoreDir)
	if len(l) != 1 || len(first) != 1 || l[0].Digest != res.ImageDigest || l[0].Ref != ref {
		t.Fatalf("store lists %+v; want one entry %s", l, ref)
	}
	if !l[0].LastUsed.After(first[0].LastUsed) {
		t.Errorf("last used not updated by the second run: %v then %v", first[0].LastUsed, l[0].LastUsed)
	}
	if rootfsDirs, staging := storeState(t, cfg.StoreDir); len(rootfsDirs) != 1 || len(staging) != 0 {
		t.Errorf("store holds rootfs %v staging %v", rootfsDirs, staging)
	}
}

// A `docker save` style tarball runs.
func TestImageFromDockerArchive(t *testing.T) {
	cfg := storeConfig(t)
	tarPath := filepath.Join(t.TempDir(), "busybox.tar")
	imagetest.WriteDockerArchive(t, tarPath, "example/busybox:1", strings.TrimPrefix(busyboxImage, "dir:"))
	ref := "docker-archive:" + tarPath
	res := runTaskWith(t, cfg, nil, echo45(ref))
	if res.Stdout != "45\n" || !strings.HasPrefix(res.ImageDigest, "sha256:") {
		t.Errorf("stdout %q stderr %q digest %q", res.Stdout, res.Stderr, res.ImageDigest)
	}
	if l := storeList(t, cfg.StoreDir); len(l) != 1 || l[0].Ref != ref || l[0].Digest != res.ImageDigest || l[0].Size <= 0 {
		t.Errorf("store lists %+v", l)
	}
}

// Concurrent first runs of one image, under one reference and another
// naming the same digest, share a single unpack.
func TestImageConcurrentFirstRunsShareUnpack(t *testing.T) {
	cfg := storeConfig(t)
	refs := []string{
		"oci:" + busyboxLayout() + ":latest", "oci:" + busyboxLayout() + ":latest",
		"oci:" + busyboxLayout(), "oci:" + busyboxLayout(),
	}
	results := make([]*result.Result, len(refs))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, ref := range refs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i] = runOnly(t, cfg, nil, echo45(ref))
		}()
	}
	close(start)
	wg.Wait()
	assertNoLeaks(t)
	for i, res := range results {
		if res.Error != "" || res.Stdout != "45\n" {
			t.Errorf("run %d (%s): error %q stdout %q stderr %q", i, refs[i], res.Error, res.Stdout, res.Stderr)
		}
		if res.ImageDigest != results[0].ImageDigest {
			t.Errorf("run %d digest %s; run 0 got %s", i, res.ImageDigest, results[0].ImageDigest)
		}
	}
	rootfs, staging := storeState(t, cfg.StoreDir)
	if len(rootfs) != 1 || len(staging) != 0 {
		t.Errorf("store holds rootfs %v staging %v; want exactly one rootfs", rootfs, staging)
	}
	if l := storeList(t, cfg.StoreDir); len(l) != 2 {
		t.Errorf("store lists %+v; want the two references", l)
	}
}

// imageCLIConfig writes a config for the CLI with the given store and the
// suite's state dir, and returns its path.
func imageCLIConfig(t *testing.T, store string, registries ...string) string {
	t.Helper()
	return writeConfig(t, map[string]any{"image": busyboxImage, "state_dir": stateDir, "store_dir": store, "audit": "",
		"policy": map[string]any{"local_images": testConfig(t).Policy.LocalImages, "registries": registries}})
}

// agentrun runs the CLI binary with args and stdin.
func agentrun(t *testing.T, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(agentrunBin(t), args...)
	cmd.Stdin = strings.NewReader(stdin)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running agentrun: %v", err)
	}
	return o.String(), e.String(), code
}

// An image that does not exist, an unreachable registry and a bad
// reference each make `agentrun run` exit 125 with a clear one-line error,
// and leave nothing behind, on the host or in the store.
func TestImageErrorsThroughCLI(t *testing.T) {
	host := imagetest.Registry(t)
	store := newStoreDir(t)
	cfgPath := imageCLIConfig(t, store, host, "127.0.0.1:1")
	missing := filepath.Join(t.TempDir(), "missing") // allowed by policy.local_images, absent
	for _, tc := range []struct {
		name, ref string
		want      []string
	}{
		{"registry 404", host + "/agentrun/nope:1", []string{"image not found"}},
		{"unreachable registry", "127.0.0.1:1/agentrun/busybox:1", []string{"registry unreachable", "127.0.0.1:1"}},
		{"registry not in policy", "127.0.0.1:2/agentrun/busybox:1", []string{"refused by policy", "policy.registries"}},
		{"a path", "/srv/rootfs", []string{"bad image reference", "dir:", "oci:", "docker-archive:"}},
		{"bad reference", "Not::A/Ref", []string{"bad image reference"}},
		{"missing layout", "oci:" + missing + ":latest", []string{"image not found", missing}},
		{"missing layout tag", "oci:" + busyboxLayout() + ":nope", []string{"image not found", `"nope"`}},
		{"missing archive", "docker-archive:" + missing + ".tar", []string{"image not found"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, code := agentrun(t, echo45(tc.ref), "run", "--config", cfgPath, "-")
			if code != 125 {
				t.Errorf("exit %d; want 125\nstdout %s\nstderr %s", code, stdout, stderr)
			}
			var res result.Result
			if err := json.Unmarshal([]byte(stdout), &res); err != nil {
				t.Fatalf("result is not JSON: %v\n%s", err, stdout)
			}
			for _, w := range append([]string{tc.ref}, tc.want...) {
				if !strings.Contains(res.Error, w) {
					t.Errorf("error %q does not say %q", res.Error, w)
				}
			}
			if res.Stdout != "" || res.ImageDigest != "" {
				t.Errorf("result %+v", res)
			}
			// The error, after (for a registry) the host-side detail.
			if lines := strings.Split(strings.TrimSpace(stderr), "\n"); len(lines) > 2 || !strings.HasPrefix(lines[len(lines)-1], "agentrun: image ") {
				t.Errorf("stderr is not one clear line: %q", stderr)
			}
			assertNoLeaks(t)
			assertStoreEmpty(t, store)
		})
	}
}

// pull, images, rmi and prune against an in-process registry, with
// --store; a pulled image then runs with its registry down.
func TestImageCLIPullImagesRmiPrune(t *testing.T) {
	var down atomic.Bool
	host := imagetest.RegistryWith(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if down.Load() && r.URL.Path != "/v2/" {
				http.Error(w, "gone\nfor now", http.StatusNotFound)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	bbRef := host + "/agentrun/busybox:1"
	bbDigest := imagetest.Push(t, host, "agentrun/busybox", "1", layoutImage(t, busyboxLayout(), "latest"))
	tinyRef := host + "/agentrun/tiny:1"
	tinyImage := func(content string) v1.Image {
		dir := t.TempDir()
		imagetest.WriteTree(t, dir, map[string]string{"hello.txt": content, "etc/": ""})
		return imagetest.DirImage(t, dir)
	}
	tinyV1 := imagetest.Push(t, host, "agentrun/tiny", "1", tinyImage("v1"))
	store := newStoreDir(t)

	cmd := func(args ...string) (string, string, int) {
		t.Helper()
		return agentrun(t, "", append([]string{args[0], "--store", store}, args[1:]...)...)
	}
	ok := func(args ...string) string {
		t.Helper()
		stdout, stderr, code := cmd(args...)
		if code != 0 || stderr != "" {
			t.Fatalf("agentrun %s: exit %d\nstdout %s\nstderr %s", strings.Join(args, " "), code, stdout, stderr)
		}
		return stdout
	}
	list := func() []map[string]any {
		t.Helper()
		var l []map[string]any
		out := ok("images", "--json")
		if err := json.Unmarshal([]byte(out), &l); err != nil {
			t.Fatalf("images --json: %v\n%s", err, out)
		}
		return l
	}
	hasRootfs := func(digest string) bool {
		_, err := os.Stat(filepath.Join(store, "rootfs", "sha256", hexOf(digest)))
		return err == nil
	}

	// pull prints "REF DIGEST" and nothing else when stdout is not a terminal.
	if out := ok("pull", bbRef); out != bbRef+" "+bbDigest+"\n" {
		t.Errorf("pull printed %q; want %q", out, bbRef+" "+bbDigest)
	}
	if out := ok("pull", tinyRef); out != tinyRef+" "+tinyV1+"\n" {
		t.Errorf("pull printed %q", out)
	}
	l := list()
	if len(l) != 2 || l[0]["ref"] != bbRef || l[0]["digest"] != bbDigest || l[1]["ref"] != tinyRef || l[1]["digest"] != tinyV1 {
		t.Errorf("images --json = %v", l)
	}
	for _, e := range l {
		if size, _ := e["size"].(float64); size <= 0 || e["last_used"] == "" || e["last_used"] == nil {
			t.Errorf("images --json entry %v lacks size or last_used", e)
		}
	}
	table := ok("images")
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "REFERENCE") || !strings.Contains(lines[0], "LAST USED") ||
		!strings.HasPrefix(lines[1], bbRef+" ") || !strings.Contains(lines[1], bbDigest[:19]) || !strings.HasPrefix(lines[2], tinyRef+" ") {
		t.Errorf("images table:\n%s", table)
	}

	// The pulled image runs from the store with its registry down.
	down.Store(true)
	stdout, stderr, code := agentrun(t, echo45(bbRef), "run", "--config", imageCLIConfig(t, store), "-")
	var res result.Result
	json.Unmarshal([]byte(stdout), &res)
	if code != 0 || res.Stdout != "45\n" || res.ImageDigest != bbDigest {
		t.Errorf("run of the pulled image: exit %d\nstdout %s\nstderr %s", code, stdout, stderr)
	}
	assertNoLeaks(t)
	// pull, unlike run, asks the registry again.
	if _, stderr, code := cmd("pull", bbRef); code != 1 || !strings.Contains(stderr, "image not found") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("pull with the registry down: exit %d stderr %q", code, stderr)
	}
	down.Store(false)

	// Re-tagging and pulling leaves the old image unreferenced: prune
	// removes it and only it.
	tinyV2 := imagetest.Push(t, host, "agentrun/tiny", "1", tinyImage("v2"))
	if out := ok("pull", tinyRef); out != tinyRef+" "+tinyV2+"\n" {
		t.Errorf("pull after re-tag printed %q; want digest %s", out, tinyV2)
	}
	if !hasRootfs(tinyV1) || !hasRootfs(tinyV2) {
		t.Error("pull removed the old image before prune")
	}
	out := ok("prune")
	if !strings.Contains(out, "removed "+tinyV1) || strings.Contains(out, tinyV2) || strings.Contains(out, bbDigest) {
		t.Errorf("prune printed %q; want it to remove %s only", out, tinyV1)
	}
	if hasRootfs(tinyV1) || !hasRootfs(tinyV2) || !hasRootfs(bbDigest) {
		t.Error("prune removed the wrong images")
	}
	if out := ok("prune"); !strings.HasPrefix(out, "0 images removed") {
		t.Errorf("second prune printed %q", out)
	}

	// rmi drops the reference and its now unused image.
	if out := ok("rmi", bbRef); out != "removed "+bbRef+"\n" {
		t.Errorf("rmi printed %q", out)
	}
	if hasRootfs(bbDigest) {
		t.Error("rmi left the busybox rootfs")
	}
	if l := list(); len(l) != 1 || l[0]["ref"] != tinyRef || l[0]["digest"] != tinyV2 {
		t.Errorf("images --json after rmi = %v", l)
	}

	// Errors: one line, exit 1.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"rmi", bbRef}, "image not found"},
		{[]string{"pull", "Not::A/Ref"}, "bad image reference"},
		{[]string{"pull", host + "/agentrun/nope:1"}, "image not found"},
	} {
		stdout, stderr, code := cmd(tc.args...)
		if code != 1 || stdout != "" || !strings.Contains(stderr, tc.want) || strings.Count(stderr, "\n") != 1 ||
			!strings.HasPrefix(stderr, "agentrun "+tc.args[0]+": ") {
			t.Errorf("agentrun %s: exit %d stdout %q stderr %q; want exit 1 and one line saying %q", strings.Join(tc.args, " "), code, stdout, stderr, tc.want)
		}
	}

	ok("rmi", tinyRef)
	if l := list(); len(l) != 0 {
		t.Errorf("images --json after removing everything = %v", l)
	}
	rootfs, staging := storeState(t, store)
	blobs, _ := os.ReadDir(filepath.Join(store, "blobs", "sha256"))
	if len(rootfs) != 0 || len(staging) != 0 || len(blobs) != 0 {
		t.Errorf("store not empty after removing everything: rootfs %v staging %v %d blobs", rootfs, staging, len(blobs))
	}
}
