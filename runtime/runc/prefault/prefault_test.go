package prefault

import (
	"bufio"
	_ "embed"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// rodata is 4 MB of read-only data that nothing reads: without the
// constructor none of it would be mapped, where the test binary's own code
// is small enough for a run to touch all of it.
//
//go:embed testdata/rodata
var rodata string

// TestPrefaultMapsTheCode: this test binary links the package's
// constructor too, so its code and read-only data are mapped in full
// before anything ran, where without it only the pages the run touched
// would be. It runs a
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
	_, rss, found := smaps(t, func(header []string) bool {
		lo, hi, _ := strings.Cut(header[0], "-")
		a, err1 := strconv.ParseUint(lo, 16, 64)
		b, err2 := strconv.ParseUint(hi, 16, 64)
		return err1 == nil && err2 == nil && a <= addr && addr < b
	})
	if !found {
		t.Fatalf("no mapping holds the heap object at %#x", addr)
	}
	if rss < 4096 {
		t.Errorf("the heap's mapping is resident for %d KiB; want 4096 at least (populated ahead)", rss)
	}
}

// checkCodeMapped fails unless this process's read-only segments (its
// code, and its read-only data with rodata in it) are mapped in full.
func checkCodeMapped(t *testing.T) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	size, rss, found := smaps(t, func(header []string) bool {
		return len(header) >= 6 && (header[1] == "r-xp" || header[1] == "r--p") && header[5] == exe
	})
	if !found || size < len(rodata)>>10 {
		t.Fatalf("no read-only mapping of %s in /proc/self/smaps holds its %d KiB of rodata (%d KiB found)", exe, len(rodata)>>10, size)
	}
	// Every page, but what another process's memory pressure took back
	// meanwhile (none on a test host).
	if rss < size*9/10 {
		t.Errorf("read-only segments mapped: %d of %d KiB; want all of them (prefault)", rss, size)
	}
}

// smaps sums the Size and Rss (KiB) of this process's mappings whose
// first line in /proc/self/smaps (range perms offset dev inode [path],
// split in fields) match accepts; found says whether any did.
func smaps(t *testing.T, match func(header []string) bool) (size, rss int, found bool) {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var in bool
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 5 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			in = match(fields)
			found = found || in
			continue
		}
		if !in || len(fields) < 2 {
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
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return size, rss, found
}
