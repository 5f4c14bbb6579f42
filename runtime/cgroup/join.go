package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// OpenDir opens the cgroup's directory on a v2 host, for a process to
// start in it (SysProcAttr.UseCgroupFD, CgroupFD); the caller closes it.
// On a v1 host there is no one directory: start the process, then Join.
func (cg *Cgroup) OpenDir() (*os.File, error) {
	if !Unified() {
		return nil, errors.New("cgroup v1: no single directory to start a process in")
	}
	fd, err := unix.Open(cg.dirs[0], unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening cgroup %s: %w", cg.path, err)
	}
	return os.NewFile(uintptr(fd), cg.dirs[0]), nil
}

// Join moves the process pid into the cgroup, in every hierarchy where
// the cgroup's directory exists. Its children forked from then on are in
// it too; those forked before are not.
func (cg *Cgroup) Join(pid int) error {
	joined := 0
	for _, d := range cg.dirs {
		if _, err := os.Stat(d); err != nil {
			continue
		}
		if err := writeFile(filepath.Join(d, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
			return fmt.Errorf("moving process %d into cgroup %s: %w", pid, d, err)
		}
		joined++
	}
	if joined == 0 {
		return fmt.Errorf("cgroup %s: no directory to move process %d into", cg.path, pid)
	}
	return nil
}
