package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/test/testenv"
)

// debianTar is a minimal Debian root filesystem, made once by mmdebstrap
// and kept ($AGENTRUN_DEBIAN_TAR).
var debianTar = testenv.EnvOr("AGENTRUN_DEBIAN_TAR", "/var/cache/agentrun/debian-bookworm-minbase-tini.tar")

// freshDebian unpacks the cached Debian root, with the package's one
// dependency beyond libc (tini) installed, (making it first when it is
// not there) into a new directory.
func freshDebian(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat(debianTar); err != nil {
		if err := os.MkdirAll(filepath.Dir(debianTar), 0o755); err != nil {
			t.Fatal(err)
		}
		// mmdebstrap writes a tarball for a name ending in .tar.
		tmp := strings.TrimSuffix(debianTar, ".tar") + ".part.tar"
		out, err := exec.Command("mmdebstrap", "--variant=minbase", "--include=tini", "--quiet", "bookworm", tmp).CombinedOutput()
		if err != nil {
			os.Remove(tmp)
			t.Fatalf("mmdebstrap (Debian package mmdebstrap, and the Debian mirror): %v: %s", err, out)
		}
		if err := os.Rename(tmp, debianTar); err != nil {
			t.Fatal(err)
		}
	}
	root := t.TempDir()
	if out, err := exec.Command("tar", "-xf", debianTar, "-C", root).CombinedOutput(); err != nil {
		t.Fatalf("unpacking %s: %v: %s", debianTar, err, out)
	}
	return root
}

// inRoot runs argv chrooted into root, in a private mount namespace with
// /proc, /sys and /dev of the host (gone when it exits); stdin is empty,
// so a dpkg question fails instead of waiting.
func inRoot(t *testing.T, root string, argv ...string) (string, error) {
	t.Helper()
	script := `set -e; r=$1; shift
mount -t proc proc "$r/proc"; mount --rbind /sys "$r/sys"; mount --rbind /dev "$r/dev"
exec chroot "$r" "$@"`
	cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "sh", "-c", script, "sh", root}, argv...)...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND=noninteractive", "LANG=C"}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestDebPackage: make deb's package installs with dpkg -i into a fresh
// Debian root: binary, seccomp helper, units, the config as a conffile and the agentrun
// group; agentrun version and doctor run there; an upgrade keeps the
// operator's edit of the config.
func TestDebPackage(t *testing.T) {
	out := t.TempDir()
	debs := map[string]string{}
	for _, v := range []string{"0.1.0", "0.1.1"} {
		cmd := exec.Command(filepath.Join(testenv.RepoRoot(), "packaging", "deb.sh"), agentrunBin(t), seccompHelper, out, v)
		cmd.Stderr = os.Stderr
		b, err := cmd.Output()
		if err != nil {
			t.Fatalf("packaging/deb.sh: %v", err)
		}
		debs[v] = strings.TrimSpace(string(b))
	}
	root := freshDebian(t)
	install := func(v string) {
		t.Helper()
		dst := filepath.Join(root, "tmp", filepath.Base(debs[v]))
		if b, err := os.ReadFile(debs[v]); err != nil {
			t.Fatal(err)
		} else if err := os.WriteFile(dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := inRoot(t, root, "dpkg", "-i", "/tmp/"+filepath.Base(dst)); err != nil {
			t.Fatalf("dpkg -i %s: %v: %s", v, err, out)
		}
	}
	install("0.1.0")

	for _, p := range []string{"usr/bin/agentrun", "usr/lib/agentrun/agentrun-seccomp", "lib/systemd/system/agentrun.socket", "lib/systemd/system/agentrun.service",
		"lib/systemd/system/agentrun@.service", "lib/systemd/system/agentrun-worker.service", "etc/agentrun/config.json",
		"etc/agentrun/tasks", "var/lib/agentrun/results"} {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("after dpkg -i: %v", err)
		}
	}
	if out, err := inRoot(t, root, "dpkg-query", "--control-show", "agentrun", "conffiles"); err != nil || !strings.Contains(out, "/etc/agentrun/config.json") {
		t.Errorf("conffiles: %v: %q", err, out)
	}
	if out, err := inRoot(t, root, "getent", "group", "agentrun"); err != nil || !strings.HasPrefix(out, "agentrun:") {
		t.Errorf("group agentrun: %v: %q", err, out)
	}
	out0, err := inRoot(t, root, "agentrun", "version")
	if err != nil || !strings.HasPrefix(out0, "agentrun ") || !strings.Contains(out0, "libcontainer: v") || !strings.Contains(out0, "runsc: ") {
		t.Errorf("agentrun version in the installed root: %v: %s", err, out0)
	}
	// doctor reads the packaged config and finds nothing that would stop
	// a run (runsc, not packaged, is only a warning) but the default
	// image: the packaged config names python:3.12-slim, which this host,
	// with no registry reachable, cannot pull, and doctor must say how
	// to get it.
	out1, err := inRoot(t, root, "agentrun", "doctor")
	t.Logf("doctor in the installed root (%v):\n%s", err, out1)
	if !strings.Contains(out1, "namespaces") {
		t.Errorf("agentrun doctor in the installed root: %v: %s", err, out1)
	}
	checks := doctorChecks(out1)
	if len(checks) < 10 {
		t.Errorf("read %d checks from agentrun doctor's table", len(checks))
	}
	for name, c := range checks {
		if c[0] == "FAIL" && name != "image" {
			t.Errorf("agentrun doctor in the installed root: %s: %s", name, c[1])
		}
	}
	// The package's helper is found and compiles the filter there.
	if c := checks["seccomp helper"]; c[0] != "ok" || !strings.HasPrefix(c[1], "/usr/lib/agentrun/agentrun-seccomp:") {
		t.Errorf("agentrun doctor in the installed root does not use the packaged seccomp helper: %q", c)
	}
	if checks["image"][0] == "FAIL" && !strings.Contains(out1, "agentrun pull python:3.12-slim") {
		t.Errorf("agentrun doctor in the installed root does not say the default image cannot be had: %s", out1)
	}

	// The operator edits the config; the upgrade keeps it without asking.
	conf := filepath.Join(root, "etc", "agentrun", "config.json")
	edited := []byte(`{"audit": "-", "server": {"max_concurrent": 3}}` + "\n")
	if err := os.WriteFile(conf, edited, 0o644); err != nil {
		t.Fatal(err)
	}
	install("0.1.1")
	if out, err := inRoot(t, root, "dpkg-query", "-W", "-f", "${Version}", "agentrun"); err != nil || out != "0.1.1" {
		t.Errorf("after the upgrade: version %q, %v", out, err)
	}
	if b, err := os.ReadFile(conf); err != nil || string(b) != string(edited) {
		t.Errorf("the upgrade changed the operator's config: %q, %v", b, err)
	}
	if _, err := os.Stat(conf + ".dpkg-new"); err == nil {
		t.Errorf("the upgrade left %s.dpkg-new", conf)
	}
}

// doctorLine is one check of agentrun doctor's table: its name (which may
// hold a space), status and detail.
var doctorLine = regexp.MustCompile(`^(\S.*?)\s{2,}(ok|warn|FAIL)\s+(.*)$`)

// doctorChecks reads agentrun doctor's table: name -> {status, detail}.
func doctorChecks(out string) map[string][2]string {
	checks := map[string][2]string{}
	for _, line := range strings.Split(out, "\n") {
		if m := doctorLine.FindStringSubmatch(line); m != nil {
			checks[m[1]] = [2]string{m[2], m[3]}
		}
	}
	return checks
}
