package prefault

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// TestPrefaultMapsTheCode: this test binary links the package's
// constructor too, so its code is mapped in full before anything ran,
// where without it only the pages the run touched would be. It runs a
// copy of itself, written here: the linker's own output can sit in the
// page cache as huge pages, mapped whole at the first touch, which an
// installed binary's are not.
func TestPrefaultMapsTheCode(t *testing.T) {
	if os.Getenv("AGENTRUN_PREFAULT_CHILD") == "1" {
		checkCodeMapped(t)
		return
	}
	runCopy(t, "TestPrefaultMapsTheCode")
}

// TestPrefaultPopulatesTheHeap: the heap's first 4 MB are in memory
// before the Go runtime writes them (__wrap_mmap), where without it only
// the pages written so far would be, a few hundred KiB in this test.
func TestPrefaultPopulatesTheHeap(t *testing.T) {
	if os.Getenv("AGENTRUN_PREFAULT_CHILD") == "1" {
		checkHeapPopulated(t)
		return
	}
	runCopy(t, "TestPrefaultPopulatesTheHeap")
}

// runCopy runs the test named in a copy of this test binary, as a child.
func runCopy(t *testing.T, name string) {
	t.Helper()
	self, err := os.Open("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	cp := filepath.Join(t.TempDir(), "prefault.test")
	out, err := os.OpenFile(cp, os.O_WRONLY|os.O_CREATE, 0o700)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(struct{ io.Writer }{out}, self); err != nil { // plain writes, no copy_file_range
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(cp, "-test.run=^"+name+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), "AGENTRUN_PREFAULT_CHILD=1")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the copy: %v\n%s", err, b)
	}
}

// heapObject keeps a fresh heap allocation's address in view.
var heapObject *[64]byte

// checkHeapPopulated fails unless the mapping that holds a fresh heap
// object is resident for 4 MB at least.
func checkHeapPopulated(t *testing.T) {
	heapObject = new([64]byte)
	addr := uint64(uintptr(unsafe.Pointer(heapObject)))
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var in, found bool
	var rss int
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 5 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			lo, hi, _ := strings.Cut(fields[0], "-")
			a, err1 := strconv.ParseUint(lo, 16, 64)
			b, err2 := strconv.ParseUint(hi, 16, 64)
			in = err1 == nil && err2 == nil && a <= addr && addr < b
			found = found || in
			continue
		}
		if in && len(fields) >= 2 && fields[0] == "Rss:" {
			rss, _ = strconv.Atoi(fields[1])
		}
	}
	if !found {
		t.Fatalf("no mapping holds the heap object at %#x", addr)
	}
	if rss < 4096 {
		t.Errorf("the heap's mapping is resident for %d KiB; want 4096 at least (populated ahead)", rss)
	}
}

// checkCodeMapped fails unless this process's code is mapped in full.
func checkCodeMapped(t *testing.T) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var inCode, found bool
	var size, rss int
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 6 && strings.Contains(fields[0], "-") {
			// A mapping's first line: range perms offset dev inode path.
			inCode = fields[1] == "r-xp" && fields[5] == exe
			if inCode {
				found = true
			}
			continue
		}
		if !inCode || len(fields) < 2 {
			continue
		}
		n, _ := strconv.Atoi(fields[1])
		switch fields[0] {
		case "Size:":
			size += n
		case "Rss:":
			rss += n
		}
	}
	if !found || size == 0 {
		t.Fatalf("no code mapping of %s in /proc/self/smaps", exe)
	}
	// Every page of the code, but what another process's memory
	// pressure took back meanwhile (none on a test host).
	if rss < size*9/10 {
		t.Errorf("code mapped: %d of %d KiB; want all of it (prefault)", rss, size)
	}
}
