package runner

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go"
)

func TestTrustCA(t *testing.T) {
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

	opts, err := trustCA([]byte("RUN CA\n"), rootfs, dir)
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
	bundle, _ := os.ReadFile(filepath.Join(dir, "ca", "bundle.pem"))
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
	if _, err := trustCA([]byte("RUN CA\n"), rootfs, t.TempDir()); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("oversized bundle: %v", err)
	}
}
