package spec

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"syscall"
)

// CheckInit checks the host file bin as the sandbox's init (WithInit): a
// regular, executable, statically linked ELF file owned by root and
// writable by no one else, since every sandbox runs it.
func CheckInit(bin string) error {
	fi, err := os.Stat(bin)
	if err != nil {
		return fmt.Errorf("init %s: %w", bin, err)
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return fmt.Errorf("init %s is not a regular file", bin)
	case fi.Mode().Perm()&0o111 == 0:
		return fmt.Errorf("init %s is not executable", bin)
	case st == nil || st.Uid != 0 || fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("init %s must be owned by root and writable by no one else (mode %v)", bin, fi.Mode().Perm())
	}
	f, err := elf.Open(bin)
	if err != nil {
		return fmt.Errorf("init %s is not an ELF executable: %w", bin, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("init " + bin + " is dynamically linked: it must run in any image (use tini-static)")
		}
	}
	return nil
}
