package runner

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/cleanup"
	"github.com/agentrun/agentrun/test/testenv"
)

// statfsType is the type of the filesystem path is in.
func statfsType(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Type
}

func TestTrustCA(t *testing.T) {
	testenv.RequireRoot(t)
	rootfs, dir := t.TempDir(), t.TempDir()
	mk := func(p, data string) {
		full := filepath.Join(rootfs, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mk("etc/ssl/certs/ca-certificates.crt", "IMAGE ROOTS\n")
	// A symlinked bundle is not mounted over, and one leading out of the
	// image is never read.
	outside := filepath.Join(t.TempDir(), "host-secret")
	os.WriteFile(outside, []byte("HOST FILE"), 0o600)
	os.MkdirAll(filepath.Join(rootfs, "etc/pki/tls/certs"), 0o755)
	os.Symlink(outside, filepath.Join(rootfs, "etc/pki/tls/certs/ca-bundle.crt"))

	var undo cleanup.Cleanup
	defer undo.Clean()
	opts, err := trustCA([]byte("RUN CA\n"), rootfs, dir, &undo)
	if err != nil {
		t.Fatal(err)
	}
	s := &specs.Spec{Process: &specs.Process{}, Linux: &specs.Linux{}}
	for _, o := range opts {
		if err := o(s); err != nil {
			t.Fatal(err)
		}
	}
	mounts := map[string]specs.Mount{}
	for _, m := range s.Mounts {
		mounts[m.Destination] = m
	}
	if m, ok := mounts["/etc/ssl/certs/ca-certificates.crt"]; !ok || !strings.Contains(strings.Join(m.Options, ","), "ro") {
		t.Errorf("system bundle not mounted read-only: %+v", s.Mounts)
	}
	if _, ok := mounts["/etc/pki/tls/certs/ca-bundle.crt"]; ok {
		t.Errorf("a symlinked bundle is mounted over")
	}
	if m, ok := mounts[CADir]; !ok || !strings.Contains(strings.Join(m.Options, ","), "ro") {
		t.Errorf("%s not mounted read-only: %+v", CADir, s.Mounts)
	}
	// What is mounted comes from the run's etc tmpfs (so the sandbox's
	// mountinfo names no host path as its source).
	for _, dst := range []string{CADir, "/etc/ssl/certs/ca-certificates.crt"} {
		if src := mounts[dst].Source; src == "" || statfsType(t, src) != unix.TMPFS_MAGIC {
			t.Errorf("%s is mounted from %q, not from a tmpfs", dst, src)
		}
	}
	bundle, _ := os.ReadFile(filepath.Join(dir, "etc", "ca", "bundle.pem"))
	if string(bundle) != "IMAGE ROOTS\n\nRUN CA\n" {
		t.Errorf("bundle = %q", bundle)
	}
	env := strings.Join(s.Process.Env, " ")
	for _, v := range []string{"SSL_CERT_FILE=" + CADir + "/bundle.pem", "REQUESTS_CA_BUNDLE=", "CURL_CA_BUNDLE=", "NODE_EXTRA_CA_CERTS=" + CADir + "/ca.pem"} {
		if !strings.Contains(env, v) {
			t.Errorf("env lacks %s: %s", v, env)
		}
	}
	// An oversized image bundle is refused, not read whole.
	mk("etc/ssl/certs/ca-certificates.crt", strings.Repeat("x", maxBundleBytes+1))
	if _, err := trustCA([]byte("RUN CA\n"), rootfs, t.TempDir(), &undo); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("oversized bundle: %v", err)
	}
	// undo unmounts the tmpfs.
	if err := undo.Clean(); err != nil {
		t.Fatal(err)
	}
	if statfsType(t, filepath.Join(dir, "etc")) == unix.TMPFS_MAGIC {
		t.Errorf("the etc tmpfs is still mounted after undo")
	}
}

// TestWriteEtcBound: the run's etc tmpfs holds the largest files a run
// writes there, and refuses more than maxEtcBytes.
func TestWriteEtcBound(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	var undo cleanup.Cleanup
	defer undo.Clean()
	for name, size := range map[string]int{"passwd": maxIdentityBytes + 100, "group": maxIdentityBytes + 100, "ca/bundle.pem": maxBundleBytes + 10000, "ca/ca.pem": 10000} {
		if _, err := writeEtc(dir, &undo, name, make([]byte, size)); err != nil {
			t.Fatalf("writing %s of %d bytes: %v", name, size, err)
		}
	}
	if _, err := writeEtc(dir, &undo, "more", make([]byte, maxEtcBytes)); !errors.Is(err, unix.ENOSPC) {
		t.Errorf("writing past maxEtcBytes: %v; want ENOSPC", err)
	}
	if err := undo.Clean(); err != nil {
		t.Fatal(err)
	}
}
