// agentrun/deepagents: deepagents' own agent and file tools (ls,
// read_file, write_file, edit_file, glob, grep, execute) driven by a
// scripted chat model (no network) through an AgentrunSandbox on a live
// sandbox of the serve at AGENTRUN_TEST_ADDRESS.

import { test } from "node:test";
import assert from "node:assert/strict";
import { createDeepAgent } from "deepagents";
import { BaseChatModel } from "@langchain/core/language_models/chat_models";
import { AIMessage } from "@langchain/core/messages";
import { Client } from "../dist/index.js";
import { AgentrunSandbox } from "../dist/deepagents.js";

const ADDRESS = process.env.AGENTRUN_TEST_ADDRESS;
const skip = !ADDRESS && "no agentrun serve";
const client = () => new Client(ADDRESS, { token: process.env.AGENTRUN_TEST_TOKEN || undefined });

/** A chat model that answers each turn with the next step of its script: tool calls, then a last text. */
class ScriptedModel extends BaseChatModel {
  constructor(script) {
    super({});
    this.script = script;
    this.turns = 0;
  }
  _llmType() {
    return "scripted";
  }
  bindTools() {
    return this;
  }
  async _generate() {
    const calls = this.script[this.turns++];
    const message = calls
      ? new AIMessage({ content: "", tool_calls: calls.map(([name, args], i) => ({ id: `t${this.turns}-${i}`, name, args, type: "tool_call" })) })
      : new AIMessage("done");
    return { generations: [{ message, text: typeof message.content === "string" ? message.content : "" }] };
  }
}

test("deepagents' file tools and execute through a live sandbox", { skip }, async () => {
  const c = client();
  const backend = await AgentrunSandbox.create(c, { timeout: "5m" });
  try {
    const W = "/workspace";
    const model = new ScriptedModel([
      [["write_file", { file_path: `${W}/notes.txt`, content: "alpha\nbeta\n" }]],
      [["read_file", { file_path: `${W}/notes.txt` }]],
      [["edit_file", { file_path: `${W}/notes.txt`, old_string: "beta", new_string: "gamma" }]],
      [["execute", { command: "mkdir -p src && echo 'print(6*7)' > src/main.py && python3 src/main.py && cat notes.txt && echo oops >&2; exit 3" }]],
      [["ls", { path: W }]],
      [["glob", { pattern: "**/*.py", path: W }]],
      [["grep", { pattern: "gamma", path: W, output_mode: "content" }]],
      [["read_file", { file_path: `${W}/missing.txt` }]],
    ]);
    const agent = createDeepAgent({ model, backend });
    const res = await agent.invoke({ messages: [{ role: "user", content: "work in the sandbox" }] }, { recursionLimit: 50 });
    const answers = res.messages.filter((m) => m.getType() === "tool");
    const text = (m) => (typeof m.content === "string" ? m.content : m.content.map((b) => b.text ?? "").join(""));
    const by = answers.map((m) => [m.name, text(m)]);
    assert.equal(res.messages.at(-1).content, "done", JSON.stringify(by));
    assert.deepEqual(by.map(([n]) => n), ["write_file", "read_file", "edit_file", "execute", "ls", "glob", "grep", "read_file"]);
    assert.deepEqual(by.map(([, t]) => t), [
      "Successfully wrote to '/workspace/notes.txt'",
      "@@ lines 1-2 of 2 @@\n     1\talpha\n     2\tbeta",
      "Successfully replaced 1 occurrence(s) in '/workspace/notes.txt'",
      "42\nalpha\ngamma\noops\n\n[Command failed with exit code 3]",
      "/workspace/src/ (directory)\n/workspace/notes.txt (12 bytes)",
      "src/main.py",
      "/workspace/notes.txt:\n  2: gamma",
      "Error: File '/workspace/missing.txt' not found",
    ]);

    // The files are the sandbox's, as its own API reads them.
    assert.equal((await backend.sandbox.files.read("notes.txt")).toString(), "alpha\ngamma\n");
    assert.equal((await backend.sandbox.exec("cat /workspace/src/main.py")).stdout, "print(6*7)\n");
  } finally {
    await backend.close();
  }
  assert.equal((await c.sandboxes.list()).filter((s) => s.id === backend.id).length, 0);
});

test("the protocol's upload, download and execute, and their errors", { skip }, async () => {
  const c = client();
  const sb = await c.sandboxes.create({ timeout: "2m" });
  const backend = new AgentrunSandbox(sb);
  try {
    assert.equal(backend.id, sb.id);
    const bytes = new Uint8Array([0, 1, 2, 255]);
    assert.deepEqual(await backend.uploadFiles([["/workspace/d/b.bin", bytes], ["/etc/passwd", bytes], ["/workspace", bytes]]), [
      { path: "/workspace/d/b.bin", error: null },
      { path: "/etc/passwd", error: "invalid_path" },
      { path: "/workspace", error: "is_directory" },
    ]);
    const down = await backend.downloadFiles(["/workspace/d/b.bin", "/workspace/none", "/workspace/d"]);
    assert.deepEqual(down.map((d) => [d.path, d.error]), [["/workspace/d/b.bin", null], ["/workspace/none", "file_not_found"], ["/workspace/d", down[2].error]]);
    assert.ok(["is_directory", "invalid_path"].includes(down[2].error), down[2].error);
    assert.deepEqual([...down[0].content], [0, 1, 2, 255]);
    assert.deepEqual(await backend.execute("pwd; echo e >&2; exit 7"), { output: "/workspace\ne\n", exitCode: 7, truncated: false });
    const killed = await backend.execute("kill -9 $$");
    assert.equal(killed.exitCode, null);
    assert.match(killed.output, /killed by SIGKILL/);
    const long = await backend.execute("sleep 30", { timeout: 1 });
    assert.match(long.output, /timed out/);
    const big = await backend.execute("head -c 1100000 /dev/zero | tr '\\0' x");
    assert.deepEqual([big.output.length, big.truncated], [1 << 20, true]);
  } finally {
    await backend.close();
    // A sandbox given to the backend stays its caller's.
    assert.equal((await sb.get()).id, sb.id);
    await sb.close();
  }
});
