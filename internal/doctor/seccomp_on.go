//go:build cgo && seccomp

package doctor

import (
	"fmt"

	libseccomp "github.com/seccomp/libseccomp-golang"
)

func seccompLibrary() (string, bool) {
	major, minor, micro := libseccomp.GetLibraryVersion()
	return fmt.Sprintf("libseccomp %d.%d.%d", major, minor, micro), true
}
