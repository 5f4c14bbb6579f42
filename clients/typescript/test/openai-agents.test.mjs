// agentrun/openai-agents against the serve at AGENTRUN_TEST_ADDRESS: the
// function tools called as the Agents SDK calls them (invoke with a
// RunContext and the model's JSON, and a run of the SDK's Runner with a
// scripted model, no network), and the sandbox client driven by the
// SDK's own shell, write_stdin and apply_patch tools of a SandboxAgent.
// Runs of one session count towards serve's quota of 3 a minute: each
// session here makes at most 3.

import { test } from "node:test";
import assert from "node:assert/strict";
import { Agent, RunContext, run, setTracingDisabled } from "@openai/agents";
import { ScriptedModel, assistantMessage, functionCall, modelResponder } from "@openai/agents/testing";
import {
  Manifest, SandboxAgent, SandboxUnsupportedFeatureError, SandboxWorkspaceReadNotFoundError, SandboxPathResolutionError,
  SandboxProviderError, filesystem, shell,
} from "@openai/agents/sandbox";
import { Client } from "../dist/index.js";
import { runCodeTool, shellTools, AgentrunSandboxClient } from "../dist/openai-agents.js";

setTracingDisabled(true);
const ADDRESS = process.env.AGENTRUN_TEST_ADDRESS;
const skip = !ADDRESS && "no agentrun serve";
const client = () => new Client(ADDRESS, { token: process.env.AGENTRUN_TEST_TOKEN || undefined });
const text = (b) => new TextDecoder().decode(b);
const invoke = (t, args) => t.invoke(new RunContext(), JSON.stringify(args));

// A PNG of one pixel, and Python that displays it and ends with a value
// whose text/html is longer than the answer carries.
const PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4z8DwHwAFAAH/iZk9HQAAAABJRU5ErkJggg==";
const FIGURE = `import base64
class Fig:
    def _repr_png_(self): return base64.b64decode(${JSON.stringify(PNG)})
    def __repr__(self): return "<Fig>"
class Big:
    def _repr_html_(self): return "<td>" + "x" * 40000 + "</td>"
    def __repr__(self): return "Big()"
display(Fig())
Big()`;

/** The output of the last tool call in a model request's input. */
function lastOutput(call) {
  const item = call.request.input.filter((i) => i.type === "function_call_result" || i.type === "apply_patch_call_output").at(-1);
  const out = item?.output;
  if (typeof out === "string") return out;
  if (Array.isArray(out)) return out;
  return out?.text ?? out;
}

test("run_code's answer: the value, figures as images, a refusal's reason", { skip }, async () => {
  const t = runCodeTool(client(), { task: { session: "ts-agents-value" } });
  assert.equal(t.name, "run_code");
  assert.match(t.description, /value/);
  // The same words as every adapter's and MCP's run_code.
  let out = await invoke(t, { code: "print(open('in.txt').read())\n6 * 7", language: "python", files: [{ name: "in.txt", content: "agents" }] });
  assert.match(out, /^stdout:\nagents\n\[exit code 0, \d+ ms, no network; run ar-[^\]]+\]\nvalue \(text\/plain\):\n42$/);

  // Through the SDK's Runner: the figure reaches the model as an image of
  // the tool's answer, the cut html is said.
  const model = new ScriptedModel([
    [functionCall("run_code", { code: FIGURE, language: "python", files: null }, { callId: "fig" })],
    modelResponder(() => [assistantMessage("seen")]),
  ]);
  const res = await run(new Agent({ name: "coder", model, tools: [t] }), "plot");
  assert.equal(res.finalOutput, "seen");
  out = lastOutput(model.lastCall);
  assert.ok(Array.isArray(out), JSON.stringify(out).slice(0, 300));
  const [first, image] = out;
  assert.equal(first.type, "input_text");
  assert.match(first.text, /\[exit code 0, /, first.text.slice(0, 500));
  assert.match(first.text, /\[display 1: image\/png image 1\]\n/);
  assert.match(first.text, new RegExp(`\\[value \\(text/html\\) cut: ${16 << 10} of 40009 characters kept\\]$`));
  assert.equal(image.type, "input_image");
  assert.ok(JSON.stringify(image).includes(PNG), JSON.stringify(image).slice(0, 300));

  // A refusal is told to the model with its reason and field.
  const refused = await invoke(t, { code: "x", language: "cobol", files: null });
  assert.match(refused, /^run_code refused \(400\): language: /);
  assert.doesNotMatch(refused, /\n\s+at /);
});

test("run_code with a context: the calls share their state", { skip }, async () => {
  const c = client();
  const ctx = await c.context();
  try {
    const t = runCodeTool(c, { context: ctx });
    assert.match(t.description, /globals/);
    const one = await invoke(t, { code: "def f(x):\n    return x * n\nn = 6", language: null, files: null });
    assert.match(one, /\[exit code 0, [^]*\[state kept: (f, n|n, f)\]$/);
    const two = await invoke(t, { code: "f(7)", language: null, files: null });
    assert.match(two, /\nvalue \(text\/plain\):\n42(\n|$)/);
  } finally {
    await ctx.close();
  }
});

test("shellTools: exec_command and write_stdin on a live sandbox, in MCP's words", { skip }, async () => {
  const c = client();
  const sb = await c.sandboxes.create({ timeout: "2m" });
  try {
    const [exec, write] = shellTools(sb);
    assert.deepEqual([exec.name, write.name], ["exec_command", "write_stdin"]);
    let out = await invoke(exec, { cmd: "echo hi; exit 3", workdir: null, yield_time_ms: null });
    assert.equal(out, "hi\n[exit code 3]");
    out = await invoke(exec, { cmd: "echo ready; read a; echo got $a; pwd", workdir: "/tmp", yield_time_ms: 500 });
    const m = /^([^]*)\[process (\d+) is still running: write_stdin with process \2 /.exec(out);
    assert.ok(m, out);
    const [before, pid] = [m[1], Number(m[2])];
    out = await invoke(write, { process: pid, chars: "line\n", close_stdin: null, yield_time_ms: 10000 });
    assert.equal(before + out, "ready\ngot line\n/tmp\n[exit code 0]");
    // close_stdin ends cat's input.
    out = await invoke(exec, { cmd: "cat", workdir: null, yield_time_ms: 0 });
    out = await invoke(write, { process: Number(/process (\d+)/.exec(out)[1]), chars: "to cat", close_stdin: true, yield_time_ms: 10000 });
    assert.equal(out, "to cat\n[exit code 0]");
    // Past an answer's 64 KiB the middle is cut, and every byte left out is counted.
    out = await invoke(exec, { cmd: "head -c 1500000 /dev/zero | tr '\\0' a", workdir: null, yield_time_ms: 30000 });
    // Every byte the stream brought and the answer left out is counted.
    // (A reader that lags past the sandbox's kept tail is skipped ahead by
    // serve, unsaid: on a loaded host fewer bytes may arrive.)
    const m2 = new RegExp(`^a{${32 << 10}}\\n\\[… (\\d+) bytes of output cut …\\]\\na{${32 << 10}}\\n` +
      `\\[output cut: an answer carries at most 65536 bytes, [^\\]]*; (\\d+) bytes left out\\]\\n\\[exit code 0\\]$`).exec(out);
    assert.ok(m2, out.slice(-300));
    assert.equal(m2[1], m2[2]);
    assert.ok(Number(m2[1]) > 0 && Number(m2[1]) <= 1500000 - (64 << 10), m2[1]);
    // It ended and was told: the model learns why it cannot write to it.
    const refused = await invoke(write, { process: pid, chars: "x", close_stdin: null, yield_time_ms: 0 });
    assert.match(refused, /^write_stdin refused: no process \d+ is running in this sandbox/);
  } finally {
    await sb.close();
  }
});

test("the sandbox client: a SandboxAgent's shell, write_stdin and apply_patch on a live sandbox", { skip }, async () => {
  const c = client();
  const sandboxes = new AgentrunSandboxClient(c, { sandbox: { timeout: "2m" } });
  const manifest = new Manifest({
    entries: { "src/app.py": { type: "file", content: "print('one')\n" }, empty: { type: "dir" } },
    environment: { GREETING: "hello" },
  });
  const session = await sandboxes.create({ manifest });
  const outputs = [];
  const step = (next) => modelResponder((call) => {
    outputs.push(lastOutput(call));
    return next(outputs.at(-1));
  });
  const sessionOf = (out) => {
    const m = /Process running with session ID (\d+)/.exec(out);
    assert.ok(m, out);
    return Number(m[1]);
  };
  try {
    assert.match(session.state.sandboxId, /^sb-/);
    assert.equal(session.supportsPty(), true);
    assert.equal(await session.directoryExists("empty"), true);
    const model = new ScriptedModel([
      // A command that waits for its input: it yields with a session id.
      [functionCall("exec_command", { cmd: "echo \"$GREETING\"; read name; echo \"hi $name\"", yield_time_ms: 500 }, { callId: "c1" })],
      step((out) => [functionCall("write_stdin", { session_id: sessionOf(out), chars: "bob\n", yield_time_ms: 10000 }, { callId: "c2" })]),
      // A terminal: tty answers its device; Ctrl-C through it ends cat.
      step(() => [functionCall("exec_command", { cmd: "tty; cat", tty: true, yield_time_ms: 500 }, { callId: "c3" })]),
      step((out) => [functionCall("write_stdin", { session_id: sessionOf(out), chars: "\u0003", yield_time_ms: 10000 }, { callId: "c4" })]),
      // apply_patch through the sandbox's files API.
      step(() => [{
        type: "apply_patch_call", callId: "c5", status: "completed",
        operation: { type: "update_file", path: "src/app.py", diff: "@@\n-print('one')\n+print('two')\n" },
      }]),
      step(() => [functionCall("exec_command", { cmd: "python3 src/app.py", workdir: "/workspace", yield_time_ms: 10000 }, { callId: "c6" })]),
      step(() => [assistantMessage("done")]),
    ]);
    const agent = new SandboxAgent({ name: "coder", model, capabilities: [shell(), filesystem()] });
    const res = await run(agent, "work", { sandbox: { session } });
    assert.equal(res.finalOutput, "done");
    outputs.push(lastOutput(model.lastCall));
    const [yielded, answered, term, interrupted, patched, ran] = outputs;
    // Each answer has what was printed since the last one: together, all of it once.
    const printed = (out) => out.slice(out.indexOf("\nOutput:\n") + 9);
    assert.match(yielded, /Process running with session ID \d+\nOutput:\n/);
    assert.match(answered, /Process exited with code 0\nOutput:\n/);
    assert.equal(printed(yielded) + printed(answered), "hello\nhi bob\n");
    assert.match(term, /Process running with session ID \d+\nOutput:\n/);
    assert.match(interrupted, /Process exited with code 130\nOutput:\n/);
    assert.match(printed(term) + printed(interrupted), /^\/dev\/pts\/\d+\r\n\^C/);
    assert.match(patched, /Updated src\/app\.py/);
    assert.match(ran, /Process exited with code 0\nOutput:\ntwo\n$/);
    assert.equal(text(await session.readFile({ path: "/workspace/src/app.py" })), "print('two')\n");

    // Ports: serve's URL for the port, with the sandbox's preview token.
    const started = await session.execCommand({ cmd: "exec python3 -m http.server 8000 --bind 127.0.0.1", yieldTimeMs: 1500 });
    assert.match(started, /Process running with session ID/);
    if (c.address.startsWith("unix:")) {
      await assert.rejects(session.resolveExposedPort(8000), SandboxUnsupportedFeatureError);
    } else {
      const ep = await session.resolveExposedPort(8000);
      assert.match(ep.url, new RegExp(`/v1/sandboxes/${session.state.sandboxId}/ports/8000/\\?preview_token=[0-9a-f]+$`));
      let body = "";
      for (let i = 0; i < 150 && !body.includes("src/"); i++) {
        const r = await fetch(ep.url);
        body = r.status === 200 ? await r.text() : "";
        if (!body) await new Promise((ok) => setTimeout(ok, 200));
      }
      assert.match(body, /Directory listing/);
      assert.equal((await fetch(ep.url.replace(/\?.*/, ""))).status, 401);
    }

    // An image of the workspace, as the SDK's image output.
    await session.sandbox.files.write("dot.png", Buffer.from(PNG, "base64"));
    assert.deepEqual(await session.viewImage({ path: "dot.png" }), { type: "image", image: { data: PNG, mediaType: "image/png" } });
    await assert.rejects(session.viewImage({ path: "src/app.py" }), SandboxProviderError);

    // Files: link-safe reads through serve; outside /workspace refused.
    assert.deepEqual((await session.listDir({ path: "src" })).map((e) => [e.name, e.path, e.type]), [["app.py", "src/app.py", "file"]]);
    assert.equal(await session.pathExists("src/app.py"), true);
    assert.equal(await session.pathExists("src/none.py"), false);
    assert.equal(await session.directoryExists("src/app.py"), false);
    await session.execCommand({ cmd: "ln -s /etc/passwd link" });
    await assert.rejects(session.readFile({ path: "link" }), SandboxWorkspaceReadNotFoundError);
    await assert.rejects(session.readFile({ path: "missing.txt" }), SandboxWorkspaceReadNotFoundError);
    await assert.rejects(session.readFile({ path: "/etc/passwd" }), SandboxPathResolutionError);
    await assert.rejects(session.readFile({ path: "../etc/passwd" }), SandboxPathResolutionError);
    assert.match(await session.writeStdin({ sessionId: 99999, chars: "x" }), /write_stdin failed: no process 99999/);

    // The workspace as an archive, into another sandbox.
    const archive = await session.persistWorkspace();
    assert.ok(archive.length > 0);
    const other = await sandboxes.create({ manifest: new Manifest() });
    try {
      await other.hydrateWorkspace(archive);
      assert.equal(text(await other.readFile({ path: "src/app.py" })), "print('two')\n");
    } finally {
      await sandboxes.delete(other.state);
    }
    const again = await sandboxes.resume(session.state);
    assert.equal(text(await again.readFile({ path: "src/app.py" })), "print('two')\n");
  } finally {
    await session.delete();
  }
  assert.equal(await session.running(), false);
  await assert.rejects(sandboxes.resume(session.state), (e) => e instanceof SandboxProviderError && e.details.status === 404);
  await assert.rejects(sandboxes.create({ manifest: new Manifest({ root: "/srv" }) }), SandboxUnsupportedFeatureError);
});

test("the sandbox client: a run's own live sandbox, made from the agent's manifest, ends with the run", { skip }, async () => {
  const c = client();
  const before = new Set((await c.sandboxes.list()).map((s) => s.id));
  const model = new ScriptedModel([
    [functionCall("exec_command", { cmd: "cat note.txt; echo \"$WHO\"" }, { callId: "o1" })],
    modelResponder((call) => [assistantMessage(lastOutput(call))]),
  ]);
  const agent = new SandboxAgent({
    name: "coder", model, capabilities: [shell()],
    defaultManifest: new Manifest({ entries: { "note.txt": { type: "file", content: "from the manifest\n" } }, environment: { WHO: "agentrun" } }),
  });
  const res = await run(agent, "read", { sandbox: { client: new AgentrunSandboxClient(c, { sandbox: { timeout: "1m" } }) } });
  assert.match(res.finalOutput, /Process exited with code 0\nOutput:\nfrom the manifest\nagentrun\n$/);
  assert.deepEqual((await c.sandboxes.list()).filter((s) => !before.has(s.id)), []);
});
