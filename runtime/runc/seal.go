package runc

import "github.com/opencontainers/runc/libcontainer/exeseal"

// SealSelf seals this binary in dir as libcontainer does for each
// container's init (CVE-2019-5736): through a read-only overlayfs of the
// binary's directory and dir where it can, at no cost; else (a kernel
// without overlayfs's mount API, or a binary whose directory holds dir)
// by copying it into a memfd, which costs each container about as much
// as the rest of a run's set-up. copied says it had to copy it, of size
// bytes.
func SealSelf(dir string) (copied bool, size int64, err error) {
	f, err := exeseal.CloneSelfExe(dir)
	if err != nil {
		return false, 0, err
	}
	defer f.Close()
	if !exeseal.IsCloned(f) {
		return false, 0, nil
	}
	if st, err := f.Stat(); err == nil {
		size = st.Size()
	}
	return true, size, nil
}
