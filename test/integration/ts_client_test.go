package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/proxy/proxytest"
	"github.com/agentrun/agentrun/test/testenv"
)

// TestTypeScriptClient runs the TypeScript client's tests
// (clients/typescript/test, node's test runner) against a real serve: on
// its unix socket without a token, and on TCP with one. They run tasks,
// stream them, decide held requests through onApproval (the service of
// serviceServeConfig), use sessions, meet refusals, and invoke each
// adapter as its framework does (the AI SDK tool's execute, the LangChain
// tool's invoke, the Agents SDK's tools invoked and run by its Runner
// with a scripted model, no network, and its sandbox client on a live
// sandbox driven by a SandboxAgent's own shell, write_stdin and
// apply_patch tools). Then the package as npm packs it is
// installed into a fresh project beside the frameworks and each of its
// subpaths is imported there (tsPackage).
func TestTypeScriptClient(t *testing.T) {
	removeNewSessions(t)
	dir := tsClient(t)
	for _, mode := range []struct{ name, listen, token string }{
		{"unix", "unix://" + filepath.Join(t.TempDir(), "ts.sock"), ""},
		{"tcp", "tcp://127.0.0.1:0", "ts-t0ken"},
	} {
		t.Run(mode.name, func(t *testing.T) {
			cfg, _ := serviceServeConfig(t, proxytest.NewInternet(t), "20s")
			srv := map[string]any{"listen": mode.listen, "max_concurrent": 2, "queue": 0,
				"quota": map[string]any{"runs_per_minute": 3, "concurrent": 0}}
			if mode.token != "" {
				srv["token"] = mode.token
			}
			cfg["server"] = srv
			s := startServeWith(t, cfg)
			address := s.base
			if strings.HasPrefix(mode.listen, "unix://") {
				address = mode.listen
			}
			cmd := exec.Command("node", "--test", "--test-concurrency=1", "--test-reporter=spec", "test/")
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "AGENTRUN_TEST_ADDRESS="+address, "AGENTRUN_TEST_TOKEN="+mode.token,
				"AGENTRUN_TEST_SERVICE_URL=https://api.internet.test/api/write/", "NO_COLOR=1")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("typescript client tests: %v\n%s", err, out)
			}
			t.Logf("typescript client tests:\n%s", out)
			if strings.Contains(string(out), "no agentrun serve") {
				t.Errorf("tests against serve skipped:\n%s", out)
			}
			s.stop()
			assertNoLeaks(t)
		})
	}
	t.Run("package", func(t *testing.T) { tsPackage(t, dir) })
}

// tsPackageFrameworks are the packages a project installs beside agentrun
// to use its adapters, at the versions of the client's package-lock.json.
var tsPackageFrameworks = []string{"ai", "@openai/agents", "@langchain/core", "zod"}

// tsPackageCheck imports every subpath of the installed package and runs
// print(1) through each adapter's tool as its framework calls it.
const tsPackageCheck = `import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { Client } from "agentrun";
import * as ai from "agentrun/ai";
import * as langchain from "agentrun/langchain";
import * as agents from "agentrun/openai-agents";
import { RunContext } from "@openai/agents";

for (const sub of ["agentrun", "agentrun/ai", "agentrun/langchain", "agentrun/openai-agents"]) {
  const at = fileURLToPath(import.meta.resolve(sub));
  assert.ok(at.startsWith(process.cwd() + "/node_modules/agentrun/dist/"), sub + " is " + at);
}
const c = new Client(process.env.AGENTRUN_TEST_ADDRESS);
const outs = {
  ai: (await ai.runCodeTool(c).execute({ code: "print(1)" }, { toolCallId: "call-1", messages: [] })).output,
  langchain: (await langchain.runCodeTool(c).invoke({ type: "tool_call", id: "call-2", name: "run_code", args: { code: "print(1)" } })).artifact,
};
for (const [name, out] of Object.entries(outs)) {
  assert.deepEqual([out.exit_code, out.stdout], [0, "1\n"], name + ": " + JSON.stringify(out));
}
// The Agents SDK's tool answers the text every adapter's model reads.
outs["openai-agents"] = await agents.runCodeTool(c).invoke(new RunContext(),
  JSON.stringify({ code: "print(1)", language: "python", files: null }));
assert.match(outs["openai-agents"], /^stdout:\n1\n\[exit code 0, /);
assert.equal(typeof agents.AgentrunSandboxClient, "function");
console.log("imported and ran:", Object.keys(outs).join(", "));
`

// tsPackageTypes imports every subpath of the installed package in
// TypeScript, for tsc to find their types beside the frameworks'.
const tsPackageTypes = `import { Client, type Context } from "agentrun";
import { runCodeTool as aiTool } from "agentrun/ai";
import { runCodeTool as langchainTool } from "agentrun/langchain";
import { runCodeTool as agentsTool, AgentrunSandboxClient } from "agentrun/openai-agents";

const c = new Client();
export const ctx: Promise<Context> = c.context();
export const tools = [aiTool(c), langchainTool(c), agentsTool(c), new AgentrunSandboxClient(c)];
`

// tsPackage packs the built client (npm pack, as a registry would get
// it), installs the tarball into a fresh project beside the frameworks,
// offline, type-checks tsPackageTypes there (the client's tsc) and runs
// tsPackageCheck against a real serve: the package's "exports" and
// "files" must hold every subpath with its types, and its peer
// dependencies must accept the frameworks. The project's lockfile is
// the client's, with the project as its root: an offline install then
// needs only the tarballs that npm ci put in npm's cache (make
// ts-client), not the registry's metadata.
func tsPackage(t *testing.T, dir string) {
	tmp := t.TempDir()
	deps := map[string]string{"agentrun": "file:" + tsPack(t, dir, tmp)}
	var lock map[string]any
	readJSON(t, filepath.Join(dir, "package-lock.json"), &lock)
	packages, _ := lock["packages"].(map[string]any)
	for _, name := range tsPackageFrameworks {
		entry, _ := packages["node_modules/"+name].(map[string]any)
		version, _ := entry["version"].(string)
		if version == "" {
			t.Fatalf("package-lock.json of %s has no version of %s", dir, name)
		}
		deps[name] = version
	}
	const name = "agentrun-package-test"
	lock["name"] = name
	delete(lock, "version")
	packages[""] = map[string]any{"name": name, "dependencies": deps}
	proj := filepath.Join(tmp, "project")
	writeJSON(t, filepath.Join(proj, "package.json"), map[string]any{
		"name": name, "private": true, "type": "module", "dependencies": deps})
	writeJSON(t, filepath.Join(proj, "package-lock.json"), lock)
	writeJSON(t, filepath.Join(proj, "tsconfig.json"), map[string]any{
		"compilerOptions": map[string]any{"target": "ES2022", "module": "NodeNext", "moduleResolution": "NodeNext",
			"strict": true, "noEmit": true, "skipLibCheck": true, "types": []string{"node"},
			"typeRoots": []string{filepath.Join(dir, "node_modules", "@types")}},
		"files": []string{"check.ts"}})
	for name, text := range map[string]string{"check.mjs": tsPackageCheck, "check.ts": tsPackageTypes} {
		if err := os.WriteFile(filepath.Join(proj, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	npm(t, proj, "install", "--offline", "--no-audit", "--no-fund")
	tsc := exec.Command("node", filepath.Join(dir, "node_modules", "typescript", "bin", "tsc"), "-p", proj)
	if out, err := tsc.CombinedOutput(); err != nil {
		t.Fatalf("tsc of the installed project's check.ts: %v\n%s", err, out)
	}

	tsRunCheck(t, proj)
}

// npm runs npm with args in dir and returns its stdout.
func npm(t *testing.T, dir string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("npm", args...)
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("npm %s in %s: %v\n%s%s", strings.Join(args, " "), dir, err, out, stderr.String())
	}
	return out
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err == nil {
		err = json.Unmarshal(data, v)
	}
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := json.MarshalIndent(v, "", "  ")
	if err == nil {
		err = os.MkdirAll(filepath.Dir(path), 0o755)
	}
	if err == nil {
		err = os.WriteFile(path, append(data, '\n'), 0o644)
	}
	if err != nil {
		t.Fatalf("writing %s: %v", path, err)
	}
}

// tsClient builds clients/typescript (npm ci when its packages are
// missing, as make ts-client does, then tsc) and returns its directory.
func tsClient(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(testenv.RepoRoot(), "clients", "typescript")
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("node is missing (test/deps.sh installs nodejs and npm)")
	}
	steps := [][]string{{"npm", "run", "build"}}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "typescript")); err != nil {
		steps = append([][]string{{"npm", "ci", "--no-audit", "--no-fund"}}, steps...)
	}
	for _, step := range steps {
		cmd := exec.Command(step[0], step[1:]...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s in %s: %v\n%s", strings.Join(step, " "), dir, err, out)
		}
	}
	return dir
}
