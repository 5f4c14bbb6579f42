// agentrun/openai-agents: the function tool called as the Agents SDK
// calls it (invoke with a RunContext and the model's JSON), and the
// sandbox client's sessions (exec, readFile, listDir, persistWorkspace,
// hydrateWorkspace), without a model, against the serve at
// AGENTRUN_TEST_ADDRESS. Each session's runs count towards serve's quota
// of 3 a minute: each session here makes at most 3.

import { test } from "node:test";
import assert from "node:assert/strict";
import { RunContext } from "@openai/agents";
import {
  Manifest, SandboxUnsupportedFeatureError, SandboxWorkspaceReadNotFoundError, SandboxPathResolutionError,
  SandboxProviderError,
} from "@openai/agents/sandbox";
import { Client } from "../dist/index.js";
import { runCodeTool, AgentrunSandboxClient } from "../dist/openai-agents.js";

const ADDRESS = process.env.AGENTRUN_TEST_ADDRESS;
const skip = !ADDRESS && "no agentrun serve";
const client = () => new Client(ADDRESS, { token: process.env.AGENTRUN_TEST_TOKEN || undefined });
const text = (b) => new TextDecoder().decode(b);

test("run_code through the Agents SDK's invoke", { skip }, async () => {
  const t = runCodeTool(client(), { task: { session: "ts-agents" } });
  assert.equal(t.type, "function");
  assert.equal(t.name, "run_code");
  const out = await t.invoke(new RunContext(), JSON.stringify({
    code: "print(open('in.txt').read())", language: "python", files: [{ name: "in.txt", content: "agents" }],
  }));
  assert.deepEqual([out.exit_code, out.stdout], [0, "agents\n"]);
  // A refusal is told to the model with its reason and field.
  const refused = await t.invoke(new RunContext(), JSON.stringify({ code: "x", language: "cobol", files: null }));
  assert.match(refused, /agentrun refused the run: .*400 language:/);
});

test("the sandbox client: a session's files outlive each exec", { skip }, async () => {
  const sandboxes = new AgentrunSandboxClient(client(), { task: { timeout: "30s" } });
  const manifest = new Manifest({
    entries: { "in/data.txt": { type: "file", content: "from the manifest" } },
    environment: { GREETING: "hello" },
  });
  const s = await sandboxes.create({ manifest });
  try {
    assert.match(s.state.sessionId, /^ss-/);
    assert.equal(s.supportsPty(), false);
    const r = await s.exec({ cmd: "cat data.txt; echo \"$GREETING\" > ../out.txt; echo err >&2; exit 3", workdir: "in" });
    assert.deepEqual([r.exitCode, r.stdout, r.stderr], [3, "from the manifest", "err\n"]);
    assert.equal(text(await s.readFile({ path: "out.txt" })), "hello\n");
    assert.equal(text(await s.readFile({ path: "/workspace/in/data.txt" })), "from the manifest");
    const names = (await s.listDir({ path: "/workspace" })).map((e) => [e.name, e.path, e.type]).sort();
    assert.deepEqual(names, [["in", "in", "dir"], ["out.txt", "out.txt", "file"]]);
    assert.deepEqual((await s.listDir({ path: "in" })).map((e) => e.path), ["in/data.txt"]);
    assert.equal(await s.pathExists("in/data.txt"), true);
    assert.equal(await s.directoryExists("in/data.txt"), false);
    // What needs a sandbox that outlives a call is refused, before any run.
    await assert.rejects(s.exec({ cmd: "sh", tty: true }), SandboxUnsupportedFeatureError);
    await assert.rejects(s.writeStdin({ sessionId: 1, chars: "x" }), SandboxUnsupportedFeatureError);
    await assert.rejects(s.resolveExposedPort(8080), SandboxUnsupportedFeatureError);
    await assert.rejects(s.readFile({ path: "missing.txt" }), SandboxWorkspaceReadNotFoundError);
    await assert.rejects(s.readFile({ path: "/etc/passwd" }), SandboxPathResolutionError);
    await assert.rejects(s.readFile({ path: "../etc/passwd" }), SandboxPathResolutionError);
    const archive = await s.persistWorkspace();
    assert.ok(archive.length > 0);
    assert.equal(await s.pathExists(".agentrun-workspace.tar"), false);

    // Hydrated into a new session, the files are there.
    const t = await sandboxes.create({ manifest: new Manifest({ entries: { empty: { type: "dir" } } }) });
    try {
      assert.equal(await t.directoryExists("empty"), true);
      await t.hydrateWorkspace(archive);
      assert.equal(text(await t.readFile({ path: "in/data.txt" })), "from the manifest");
      assert.equal(text(await t.readFile({ path: "out.txt" })), "hello\n");
    } finally {
      await sandboxes.delete(t.state);
    }
    const again = await sandboxes.resume(s.state);
    assert.equal(text(await again.readFile({ path: "out.txt" })), "hello\n");
  } finally {
    await s.delete();
  }
  assert.equal(await s.running(), false);
  await assert.rejects(sandboxes.resume(s.state), (e) => e instanceof SandboxProviderError && e.details.status === 404);
  await assert.rejects(sandboxes.create({ manifest: new Manifest({ root: "/srv" }) }), SandboxUnsupportedFeatureError);
});
