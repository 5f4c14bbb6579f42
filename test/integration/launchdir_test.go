package integration

import (
	"strings"
	"testing"

	"github.com/agentrun/agentrun/internal/launcher"
)

// TestLauncherDirOneReadOnlyMount: from inside a cold Python run, the
// directory of agentrun's Python files is one mount, read-only (not one
// mount per file), and the sandbox can neither write, replace, remove
// nor add any file in it.
func TestLauncherDirOneReadOnlyMount(t *testing.T) {
	code := `import errno, os
d = "` + launcher.Dir + `"
at = [l.split()[4] for l in open("/proc/self/mountinfo")]
mine = [l.split() for l in open("/proc/self/mountinfo") if l.split()[4] == d or l.split()[4].startswith(d + "/")]
print("mounts", len(mine), [m[4] for m in mine], all("ro" in m[5].split(",") for m in mine))
def refused(f):
    try:
        f()
        return False
    except OSError as e:
        return e.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
names = sorted(os.listdir(d))
print("files", names)
print("write", all(refused(lambda n=n: open(d + "/" + n, "r+b").write(b"x")) for n in names))
print("add", refused(lambda: open(d + "/agentrun_run.py.new", "xb")))
print("remove", all(refused(lambda n=n: os.unlink(d + "/" + n)) for n in names))
print("replace", refused(lambda: os.rename(d + "/" + names[0], d + "/x")))
print("mkdir", refused(lambda: os.mkdir(d + "/sub")))
`
	res := runIn(t, "libcontainer", pyTask(code, nil))
	if res.ExitCode != 0 {
		t.Fatalf("exit %d: %s", res.ExitCode, res.Stderr)
	}
	want := "mounts 1 ['" + launcher.Dir + "'] True\n" +
		"files ['agentrun_run.py', 'agentrun_run.pyc', 'agentrun_runlib.py', 'agentrun_start.py']\n" +
		"write True\nadd True\nremove True\nreplace True\nmkdir True\n"
	got := res.Stdout
	// The bytecode is there once a runner made it; the suite may not have yet.
	if !strings.Contains(got, "agentrun_run.pyc") {
		want = strings.Replace(want, "'agentrun_run.pyc', ", "", 1)
	}
	if got != want {
		t.Errorf("inside the sandbox:\n%s\nwant:\n%s", got, want)
	}
}
