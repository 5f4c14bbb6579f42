package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// tsRegistryFrameworks are what a project using agentrun's adapters has
// installed, at the versions npm picks for this machine's Node from the
// registry (on Debian's Node 20: ai 6, as ai 7 wants Node 22).
var tsRegistryFrameworks = []string{"ai", "@langchain/core", "@openai/agents", "deepagents", "zod"}

// tsRegistryCheck imports every subpath of the installed package and
// runs the AI SDK's and LangChain's run_code (a value and a figure) and
// the deepagents backend's execute against a real serve, with the
// frameworks as npm picked them.
const tsRegistryCheck = `import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { Client } from "agentrun";
import * as ai from "agentrun/ai";
import * as langchain from "agentrun/langchain";
import * as agents from "agentrun/openai-agents";
import * as deep from "agentrun/deepagents";

const versions = {};
for (const name of ["ai", "@langchain/core", "@openai/agents", "deepagents", "zod"]) {
  versions[name] = JSON.parse(readFileSync("node_modules/" + name + "/package.json", "utf8")).version;
}
for (const sub of ["agentrun", "agentrun/ai", "agentrun/langchain", "agentrun/openai-agents", "agentrun/deepagents"]) {
  const at = fileURLToPath(import.meta.resolve(sub));
  assert.ok(at.startsWith(process.cwd() + "/node_modules/agentrun/dist/"), sub + " is " + at);
}
assert.equal(typeof agents.runCodeTool, "function");
assert.equal(typeof agents.AgentrunSandboxClient, "function");

const c = new Client(process.env.AGENTRUN_TEST_ADDRESS);
const figure = "import zlib, struct\n" +
  "def _png():\n" +
  "    def chunk(t, d): return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d))\n" +
  "    return (b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 1, 1, 8, 2, 0, 0, 0))\n" +
  "            + chunk(b'IDAT', zlib.compress(b'\\x00\\xff\\x00\\x00')) + chunk(b'IEND', b''))\n" +
  "class Fig:\n" +
  "    def _repr_png_(self): return _png()\n" +
  "display(Fig())\n" +
  "6 * 7\n";
const t = ai.runCodeTool(c);
const call = { toolCallId: "call-1", messages: [] };
const a = await t.execute({ code: figure }, call);
assert.equal(a.output.value, "42", a.text);
const mo = await t.toModelOutput({ ...call, input: {}, output: a });
const image = Number(versions.ai.split(".")[0]) >= 7 ? "file" : "image-data";
assert.deepEqual(mo.value.map((p) => p.type), ["text", image], JSON.stringify(mo).slice(0, 300));

const msg = await langchain.runCodeTool(c).invoke({ type: "tool_call", id: "call-2", name: "run_code", args: { code: figure } });
assert.deepEqual(msg.content.map((b) => b.type), ["text", "image"]);
assert.equal(msg.artifact.value, "42");

const backend = await deep.AgentrunSandbox.create(c, { timeout: "2m" });
try {
  assert.deepEqual(await backend.execute("echo hi"), { output: "hi\n", exitCode: 0, truncated: false });
} finally {
  await backend.close();
}
console.log("with", JSON.stringify(versions), "imported every subpath and ran ai, langchain and deepagents");
`

// TestTypeScriptPackageFromRegistry installs the TypeScript client as a
// new user would, beside the frameworks as npm picks them today for the
// Node that Debian ships: a fresh project installs them from the npm
// registry first (as a project that has them already), then the client
// as npm packs it. The client's peer ranges must accept what npm picked
// (no ERESOLVE, no --legacy-peer-deps), each optional peer marked so;
// then every subpath is imported there and the adapters run against a
// real serve. The registry must be reachable (as make test's npm ci
// needs it).
func TestTypeScriptPackageFromRegistry(t *testing.T) {
	dir := tsClient(t)
	tmp := t.TempDir()
	tarball := tsPack(t, dir, tmp)
	var pkg struct {
		PeerDependencies     map[string]string          `json:"peerDependencies"`
		PeerDependenciesMeta map[string]map[string]bool `json:"peerDependenciesMeta"`
	}
	readJSON(t, filepath.Join(dir, "package.json"), &pkg)
	for name := range pkg.PeerDependencies {
		if !pkg.PeerDependenciesMeta[name]["optional"] {
			t.Errorf("peer dependency %s is not marked optional (peerDependenciesMeta): the client needs none of them", name)
		}
	}

	proj := filepath.Join(tmp, "project")
	writeJSON(t, filepath.Join(proj, "package.json"), map[string]any{
		"name": "agentrun-registry-test", "private": true, "type": "module"})
	if err := os.WriteFile(filepath.Join(proj, "check.mjs"), []byte(tsRegistryCheck), 0o644); err != nil {
		t.Fatal(err)
	}
	// npm's own cache for the test: nothing of the machine's is used or left.
	cache := filepath.Join(tmp, "npm-cache")
	install := func(args ...string) {
		t.Helper()
		npm(t, proj, append([]string{"install", "--no-audit", "--no-fund", "--cache", cache}, args...)...)
	}
	install(tsRegistryFrameworks...)
	install(tarball)

	tsRunCheck(t, proj)
}

// tsPack packs the built client in dir (npm pack, as a registry would
// get it) into dest and returns the tarball's path.
func tsPack(t *testing.T, dir, dest string) string {
	t.Helper()
	var packed []struct {
		Filename string `json:"filename"`
	}
	if err := json.Unmarshal(npm(t, dir, "pack", "--json", "--pack-destination", dest), &packed); err != nil || len(packed) != 1 {
		t.Fatalf("npm pack: %v, %+v", err, packed)
	}
	return filepath.Join(dest, packed[0].Filename)
}

// tsRunCheck runs check.mjs of the installed project proj against a
// real serve of its own, on a unix socket, and checks the host is left
// clean.
func tsRunCheck(t *testing.T, proj string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "ts.sock")
	s := startServeWith(t, serveConfig(map[string]any{"listen": "unix://" + sock},
		map[string]any{"local_images": []string{*imagesDir}}))
	cmd := exec.Command("node", "check.mjs")
	cmd.Dir = proj
	cmd.Env = append(os.Environ(), "AGENTRUN_TEST_ADDRESS=unix://"+sock, "NO_COLOR=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node check.mjs in the installed project: %v\n%s", err, out)
	}
	t.Logf("%s", strings.TrimSpace(string(out)))
	s.stop()
	assertNoLeaks(t)
}
