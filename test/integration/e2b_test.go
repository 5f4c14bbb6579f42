package integration

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// e2bServe is a serve with an E2B door: its base URL for the SDKs and
// its keys, by user.
type e2bServe struct {
	*served
	keys map[string]string
}

// startE2B starts serve on loopback TCP with an e2b section: templates
// base and code-interpreter-v1 are the python image; one key per user
// of users, each in a root-only file. extra is merged into the config.
func startE2B(t *testing.T, users []string, extra map[string]any) *e2bServe {
	t.Helper()
	dir := t.TempDir()
	keys := map[string]string{}
	keyFiles := map[string]any{}
	for _, u := range users {
		b := make([]byte, 20)
		rand.Read(b)
		keys[u] = "e2b_" + hex.EncodeToString(b)
		p := filepath.Join(dir, u+".key")
		if err := os.WriteFile(p, []byte(keys[u]+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		keyFiles[u] = map[string]any{"file": p}
	}
	cfg := serveConfig(map[string]any{"listen": "tcp://127.0.0.1:0", "token": "not-e2b"},
		map[string]any{"local_images": []string{*imagesDir}})
	cfg["e2b"] = map[string]any{
		"templates": map[string]any{"base": pythonImage, "code-interpreter-v1": pythonImage,
			"python-data": "dir:" + filepath.Join(*imagesDir, "python-data", "rootfs")},
		"keys": keyFiles,
	}
	for k, v := range extra {
		cfg[k] = v
	}
	return &e2bServe{served: startServeWith(t, cfg), keys: keys}
}

// node runs script of test/e2b-client with E2B's variables naming the
// door and key, then args, and decodes the JSON object its last line of
// stdout reports (lib.mjs). A "fatal" entry fails the test.
func (s *e2bServe) node(t *testing.T, key, script string, args ...string) map[string]json.RawMessage {
	t.Helper()
	dir := npmPackages(t, "e2b-client", "e2b")
	cmd := exec.Command("node", append([]string{filepath.Join(dir, script)}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+s.base+"/e2b", "E2B_SANDBOX_URL="+s.base+"/e2b",
		"E2B_API_KEY="+key, "E2B_DOMAIN=agentrun.invalid")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var seen map[string]json.RawMessage
	if jerr := json.Unmarshal([]byte(lines[len(lines)-1]), &seen); err != nil || jerr != nil {
		t.Fatalf("node %s: %v %v\nstdout: %s\nstderr: %s\nserve: %s", script, err, jerr, out, stderr.String(), s.log())
	}
	if f, ok := seen["fatal"]; ok {
		t.Fatalf("node %s failed: %s\nserve: %s", script, f, s.log())
	}
	return seen
}

// e2bGot decodes seen[name] into v, failing the test if it is absent.
func e2bGot(t *testing.T, seen map[string]json.RawMessage, name string, v any) {
	t.Helper()
	raw, ok := seen[name]
	if !ok {
		t.Fatalf("the script saw no %q: %v", name, seen)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("%s: %v: %s", name, err, raw)
	}
}

// TestE2BControl: E2B's SDK creates a sandbox of a template through the
// door, reads it back with its metadata and life, and kills it, after
// which the SDK finds none; nothing is left on the host.
func TestE2BControl(t *testing.T) {
	s := startE2B(t, []string{"alice"}, nil)
	seen := s.node(t, s.keys["alice"], "control.mjs")
	var info struct {
		SandboxID, TemplateID, State, EnvdVersion string
		Metadata                                  map[string]string
		Life                                      int64
	}
	e2bGot(t, seen, "info", &info)
	if !strings.HasPrefix(info.SandboxID, "sb-") || info.TemplateID != "base" || info.State != "running" ||
		info.Metadata["suite"] != "e2b" || info.Life < 110_000 || info.Life > 121_000 || info.EnvdVersion == "" {
		t.Errorf("getInfo: %+v", info)
	}
	var killed string
	e2bGot(t, seen, "killed", &killed)
	if killed != "SandboxNotFoundError" {
		t.Errorf("getInfo after kill: %s", killed)
	}
	s.stop()
	assertNoLeaks(t)
}
