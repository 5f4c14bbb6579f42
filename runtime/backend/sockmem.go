package backend

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// tcpLimitFile is the cgroup v1 memory controller's cap on the TCP buffer
// memory of a cgroup's sockets.
const tcpLimitFile = "memory.kmem.tcp.limit_in_bytes"

// ChargeSocketMemory caps the TCP socket buffers of the cgroup v1 memory
// cgroup at memDir at limit bytes. cgroup v1 does not count socket buffers
// in memory.limit_in_bytes, and without this cap a sandbox could hold
// gigabytes of them; past the cap its sends wait, as under memory
// pressure. It must run after the cgroup is made and before the program
// starts. Where the kernel lacks the file (no TCP accounting) it does
// nothing and reports false; cgroup v2 needs no call, since it charges
// socket memory to memory.current under memory.max.
func ChargeSocketMemory(memDir string, limit int64) (bool, error) {
	if limit <= 0 {
		return false, fmt.Errorf("socket memory limit %d is not positive", limit)
	}
	if _, err := os.Stat(memDir); err != nil {
		return false, fmt.Errorf("limiting socket memory: %w", err)
	}
	path := filepath.Join(memDir, tcpLimitFile)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0) // never created
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("limiting socket memory: %w", err)
	}
	_, err = f.WriteString(strconv.FormatInt(limit, 10))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, fmt.Errorf("limiting socket memory: writing %s: %w", path, err)
	}
	return true, nil
}
