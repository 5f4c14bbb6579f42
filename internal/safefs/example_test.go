package safefs_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/agentrun/agentrun/internal/safefs"
)

// A file a sandbox may have replaced with a link is read through a Dir:
// the link is refused, never followed.
func Example() {
	dir, _ := os.MkdirTemp("", "display")
	defer os.RemoveAll(dir)
	os.Symlink("/etc/shadow", filepath.Join(dir, "report"))

	d, err := safefs.Open(dir)
	if err != nil {
		panic(err)
	}
	defer d.Close()
	_, err = d.ReadFile("report", 1<<20)
	fmt.Println(err != nil)
	fmt.Println(d.WriteFile("report", []byte("x"), 0o444) != nil)
	// Output:
	// true
	// true
}
