package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/server"
	"github.com/agentrun/agentrun/test/testenv"
)

// TestServeWarmPool: serve keeps the warm sandboxes its config asks for
// and runs tasks in them; /healthz and /metrics say the image is warm.
// With a preload the image lacks, the image is served plain sandboxes,
// both say why, and its runs still succeed.
func TestServeWarmPool(t *testing.T) {
	for _, tc := range []struct {
		preload []string
		want    string // in sys.modules
	}{{[]string{"json"}, "True"}, {[]string{"json", "no_such_module_here"}, "False"}} {
		sock := filepath.Join(t.TempDir(), "agentrun.sock")
		s := startServe(t, map[string]any{"listen": "unix://" + sock, "pool": map[string]any{
			pythonImage: map[string]any{"count": 1, "warm": map[string]any{"language": "python", "preload": tc.preload}}}})
		s.waitPool(pythonImage, 1)
		var res result.Result
		if resp := s.post(`{"code": "import sys; print('json' in sys.modules, sys.argv)"}`, &res); resp.StatusCode != 200 {
			t.Fatalf("status %d: %+v", resp.StatusCode, res)
		}
		if res.Stdout != tc.want+" ['/workspace/main.py']\n" || res.ExitCode != 0 {
			t.Fatalf("preload %v: result %+v", tc.preload, res)
		}
		var h server.Health
		s.get("/healthz", &h)
		m := s.scrape()
		if h.Pool == nil || h.Pool.Hits < 1 {
			t.Fatalf("healthz %+v; want a pool hit", h)
		}
		if tc.want == "True" {
			// MCP's run_code and `agentrun run --server` get warm
			// sandboxes through serve too.
			s.waitPool(pythonImage, 1)
			c, err := server.NewClient("unix://"+sock, "")
			if err != nil {
				t.Fatal(err)
			}
			url, hc := c.HTTP("/mcp")
			cs := mcpClient(t, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: -1})
			res := call(t, cs, map[string]any{"code": "import sys; print('json' in sys.modules)"})
			if out := structured(t, res); res.IsError || out.Stdout != "True\n" {
				t.Errorf("run_code: %v %q", res.IsError, answerText(t, res))
			}
			cs.Close()
			s.waitPool(pythonImage, 1)
			taskFile := filepath.Join(t.TempDir(), "task.json")
			if err := os.WriteFile(taskFile, []byte(`{"code": "import sys; print('json' in sys.modules)"}`), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(agentrunBin(t), "run", "--server", "unix://"+sock, taskFile).Output()
			if err != nil || !strings.Contains(string(out), `"stdout": "True\n"`) {
				t.Errorf("agentrun run --server: %v: %s", err, out)
			}
			s.get("/healthz", &h)
			m = s.scrape()
			if h.Pool.Hits != 3 {
				t.Errorf("healthz %+v; want 3 pool hits", h.Pool)
			}
		}
		why := h.Pool.Warm[pythonImage]
		if tc.want == "True" {
			if h.Status != "ok" || why != runapi.WarmOK || m[`agentrun_pool_warm{image="`+pythonImage+`",reason=""}`] != 1 {
				t.Errorf("healthz %+v (pool %+v), metrics %v; want ok and warm", h, h.Pool, m)
			}
		} else {
			if h.Status != "degraded" || !strings.Contains(why, "no_such_module_here") || m[`agentrun_pool_warm{image="`+pythonImage+`",reason="`+why+`"}`] != 0 {
				t.Errorf("healthz %+v (pool %+v), metrics %v; want degraded, the reason", h, h.Pool, m)
			}
			if _, ok := m[`agentrun_pool_warm{image="`+pythonImage+`",reason="`+why+`"}`]; !ok {
				t.Errorf("metrics have no agentrun_pool_warm with the reason %q: %v", why, m)
			}
		}
		s.stop()
	}
}

// pythonData is the python-data test image (numpy and pandas), built by
// test/images/build.sh on first use.
func pythonData(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(*imagesDir, "python-data")
	if os.Getenv("AGENTRUN_SKIP_IMAGE_BUILD") == "" {
		cmd := exec.Command(filepath.Join(testenv.RepoRoot(), "test", "images", "build.sh"), "python-data")
		cmd.Env = append(os.Environ(), "AGENTRUN_IMAGES="+*imagesDir)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building python-data: %v: %s", err, out)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "rootfs", "bin")); err != nil {
		t.Fatalf("test image python-data missing: %v (run test/images/build.sh python-data)", err)
	}
	return "dir:" + filepath.Join(dir, "rootfs")
}

// TestWarmNumpyPandas: numpy and pandas preloaded, a task that imports
// and uses them runs warm, and its cpu_ms is its own: less than a cold
// run's of the same task, which pays the imports.
func TestWarmNumpyPandas(t *testing.T) {
	ref := pythonData(t)
	extra := map[string]any{"image": ref, "limits": map[string]any{"timeout": "30s", "memory": "512m"}}
	p := newWarm(t, ref, 1, []string{"numpy", "pandas"}, pyTask("pass", extra), true)
	code := "import numpy, pandas\nprint(pandas.DataFrame({'a': numpy.arange(4)}).a.sum())"
	warm := p.run(pyTask(code, extra), true)
	cold := runOnly(t, p.cfg, nil, pyTask(code, extra))
	if warm.Stdout != "6\n" || cold.Stdout != "6\n" || warm.ExitCode != 0 {
		t.Fatalf("warm %q (stderr %q), cold %q (stderr %q)", warm.Stdout, warm.Stderr, cold.Stdout, cold.Stderr)
	}
	t.Logf("cpu_ms warm %d cold %d; duration_ms warm %d cold %d; memory_peak warm %d cold %d",
		warm.CPUMS, cold.CPUMS, warm.DurationMS, cold.DurationMS, warm.MemoryPeakBytes, cold.MemoryPeakBytes)
	if warm.CPUMS >= cold.CPUMS {
		t.Errorf("warm cpu_ms %d not below cold's %d: the preload counted as the task's", warm.CPUMS, cold.CPUMS)
	}
}
