// Package secret reads the secrets agentrun is given as files (an injected
// header's value, an approval webhook's signing key) at the time of use:
// root's alone, bounded, one line. Errors never hold a secret.
package secret

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"

	"github.com/agentrun/agentrun/internal/netpolicy"
)

// Read reads a secret from file at the time of use (an injected
// header's value, an approval webhook's signing key): a regular file owned
// by root that no one else may read or write, of at most
// netpolicy.MaxSecretBytes, without its final line break. Errors name what
// is wrong with the file, never its content.
func Read(file string) (string, error) {
	f, err := os.OpenFile(file, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return "", errors.New("credential file cannot be opened")
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return "", errors.New("credential file is not a regular file")
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Uid != 0 || fi.Mode().Perm()&0o077 != 0 {
		return "", errors.New("credential file is not root's alone (owner root, mode 0600 or 0400)")
	}
	b, err := io.ReadAll(io.LimitReader(f, netpolicy.MaxSecretBytes+1))
	if err != nil {
		return "", errors.New("credential file cannot be read")
	}
	if len(b) > netpolicy.MaxSecretBytes {
		return "", fmt.Errorf("credential file larger than %d bytes", netpolicy.MaxSecretBytes)
	}
	s := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if s == "" {
		return "", errors.New("credential file is empty")
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return "", errors.New("credential file holds a control character or line break")
		}
	}
	return s, nil
}
