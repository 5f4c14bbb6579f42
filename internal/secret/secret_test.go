//go:build linux

package secret

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/internal/netpolicy"
	"github.com/agentrun/agentrun/test/testenv"
)

// TestRead: a secret file is read without its final line break; one that
// is not root's alone, too large, of more than one line or empty, or a
// symlink, is refused in words that never hold the secret.
func TestRead(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	write := func(name, data string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		return p
	}
	if v, err := Read(write("ok", "s3cret\n", 0o600)); err != nil || v != "s3cret" {
		t.Errorf("Read(ok) = %q, %v", v, err)
	}
	for name, tc := range map[string]struct {
		data string
		mode os.FileMode
		want string
	}{
		"world": {"s3cret", 0o644, "root's alone"},
		"group": {"s3cret", 0o640, "root's alone"},
		"big":   {strings.Repeat("x", netpolicy.MaxSecretBytes+1), 0o600, "larger than"},
		"crlf":  {"a\r\nb", 0o600, "line break"},
		"empty": {"\n", 0o600, "empty"},
	} {
		_, err := Read(write(name, tc.data, tc.mode))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Read(%s) = %v; want %q", name, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Read(%s) error holds the secret: %v", name, err)
		}
	}
	os.Symlink(filepath.Join(dir, "ok"), filepath.Join(dir, "link"))
	if _, err := Read(filepath.Join(dir, "link")); err == nil {
		t.Errorf("Read(symlink) = nil error; want a refusal")
	}
}
