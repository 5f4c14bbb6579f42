package integration

import (
	"encoding/base64"
	"slices"
	"strings"
	"testing"
	"time"
)

// collectBomb makes, in the workspace: 1000 links d/lNNN -> . (through
// which d/*/*/* once matched 10^9 paths, and agentrun grew past 2 GB), a
// link p -> /etc/passwd, two files whose names are not valid UTF-8, and,
// with wide, 120,000 files under w/ (more entries than collect looks at).
func collectBomb(wide bool) string {
	code := `
import os
os.mkdir("/workspace/d")
for i in range(1000):
    os.symlink(".", "/workspace/d/l%03d" % i)
os.symlink("/etc/passwd", "/workspace/p")
for n in (b"/workspace/r\xff", b"/workspace/r\xfe"):
    open(n, "wb").write(n)
`
	if wide {
		code += `
os.mkdir("/workspace/w")
for i in range(120000):
    open("/workspace/w/%06d.txt" % i, "w").close()
`
	}
	return code
}

// TestCollectSymlinkBomb runs the link loop through the CLI on each
// runtime: agentrun stays small and quick, p is listed with an error, the
// patterns that match nothing are named, and the names that are not UTF-8
// come back as two distinct keys with their bytes.
func TestCollectSymlinkBomb(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		task := pyTask(collectBomb(false), map[string]any{"runtime": rt,
			"collect": []string{"d/*/*/*", "p", "missing.txt", "r*"}, "limits": map[string]any{"timeout": "30s"}})
		out := runCLI(t, badConfig(t, nil), "", strings.NewReader(task), "run", "-")
		assertNoLeaks(t)
		res := out.res
		if res == nil || res.Error != "" || res.ExitCode != 0 {
			t.Fatalf("run failed: code %d, result %+v\nstderr %s", out.code, res, out.stderr)
		}
		if out.maxRSS > 256<<20 || out.took > 30*time.Second {
			t.Errorf("agentrun peaked at %d MiB and took %v; want under 256 MiB and 30s", out.maxRSS>>20, out.took)
		}
		if f, ok := res.Files["p"]; !ok || f.Error == "" || f.ContentBase64 != "" {
			t.Errorf("p -> /etc/passwd named exactly: %+v (listed %v); want listed with an error", f, ok)
		}
		if res.Collect == nil || !slices.Equal(res.Collect.Unmatched, []string{"d/*/*/*", "missing.txt"}) || res.Collect.Cut != "" {
			t.Errorf("collect report %+v; want d/*/*/* and missing.txt unmatched, no cut", res.Collect)
		}
		names := map[string]bool{}
		for key, f := range res.Files {
			if key == "p" {
				continue
			}
			raw, _ := base64.StdEncoding.DecodeString(f.NameBase64)
			content, _ := base64.StdEncoding.DecodeString(f.ContentBase64)
			if string(content) != "/workspace/"+string(raw) {
				t.Errorf("key %q: name_base64 %q, content %q", key, raw, content)
			}
			names[string(raw)] = true
		}
		if len(res.Files) != 3 || !names["r\xff"] || !names["r\xfe"] {
			t.Errorf("files %v: want p and the two names r\\xff, r\\xfe", res.Files)
		}
	})
}

// TestCollectCutAtEntries: a workspace of 120,000 entries is walked up to
// the bound on entries looked at, and the result says collect was cut.
func TestCollectCutAtEntries(t *testing.T) {
	task := pyTask(collectBomb(true), map[string]any{
		"collect": []string{"p", "w/*.png", "missing.txt"}, "limits": map[string]any{"timeout": "60s"}})
	out := runCLI(t, badConfig(t, nil), "", strings.NewReader(task), "run", "-")
	assertNoLeaks(t)
	res := out.res
	if res == nil || res.Error != "" || res.ExitCode != 0 {
		t.Fatalf("run failed: code %d, result %+v\nstderr %s", out.code, res, out.stderr)
	}
	if res.Collect == nil || res.Collect.Cut != "100000 directory entries looked at" || len(res.Collect.Unmatched) != 0 {
		t.Errorf("collect report %+v; want cut at 100000 entries, nothing called unmatched", res.Collect)
	}
	if _, ok := res.Files["p"]; !ok || len(res.Files) != 1 {
		t.Errorf("files %v; want p only", res.Files)
	}
	if out.maxRSS > 256<<20 {
		t.Errorf("agentrun peaked at %d MiB", out.maxRSS>>20)
	}
}
