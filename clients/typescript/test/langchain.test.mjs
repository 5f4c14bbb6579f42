// agentrun/langchain's tools, called as LangChain calls them (invoke,
// with a tool call as a model sends it), without a model, against the
// serve at AGENTRUN_TEST_ADDRESS.

import { test } from "node:test";
import assert from "node:assert/strict";
import { Client } from "../dist/index.js";
import { runCodeTool, shellTools } from "../dist/langchain.js";
import { FIGURE, TABLE, isPNG, session } from "../testdata/fixtures.mjs";
const ADDRESS = process.env.AGENTRUN_TEST_ADDRESS;
const skip = !ADDRESS && "no agentrun serve";
const client = () => new Client(ADDRESS, { token: process.env.AGENTRUN_TEST_TOKEN || undefined });
let calls = 0;
const toolCall = (name, args) => ({ type: "tool_call", id: `call-${++calls}`, name, args });

test("run_code through LangChain's invoke", { skip }, async () => {
  const t = runCodeTool(client(), { task: { session: "ts-langchain" } });
  assert.equal(t.name, "run_code");
  // Bare input: the content blocks.
  const blocks = await t.invoke({ code: "import sys; print(open('in.txt').read()); sys.exit(2)", language: "python", files: { "in.txt": "lc" } });
  assert.equal(blocks.length, 1);
  assert.match(blocks[0].text, /^stdout:\nlc\n\[exit code 2, \d+ ms, no network; run ar-[^\]]+\]$/);
  // A tool call as a model sends it: a ToolMessage, the result's fields its artifact.
  const msg = await t.invoke(toolCall("run_code", { code: "print(6*7)" }));
  assert.equal(msg.tool_call_id, `call-${calls}`);
  assert.equal(msg.artifact.stdout, "42\n");
  assert.equal(msg.artifact.exit_code, 0);
  // What the schema refuses never reaches the server.
  await assert.rejects(t.invoke({ language: "python" }), /schema|code/i);
});

test("a refusal is the tool's text, with its field, and no stack", { skip }, async () => {
  const t = runCodeTool(client(), { task: { session: session() } });
  const msg = await t.invoke(toolCall("run_code", { code: "print(1)", language: "cobol" }));
  assert.match(msg.content[0].text, /^run_code refused \(400\): language: /);
  assert.doesNotMatch(msg.content[0].text, /\n\s+at /);
  assert.equal(msg.artifact.error, msg.content[0].text);
});

test("the value: text/plain, and text/html cut to a bound, the cut said", { skip }, async () => {
  const t = runCodeTool(client(), { language: "python", task: { session: session() } });
  const msg = await t.invoke(toolCall("run_code", { code: "x = 6\nx * 7" }));
  assert.equal(msg.artifact.value, "42");
  assert.match(msg.content[0].text, /\nvalue \(text\/plain\):\n42$/);
  const h = (await t.invoke(toolCall("run_code", { code: TABLE }))).content[0].text;
  assert.match(h, /value \(text\/plain\):\nTable\(2000 rows\)\n/);
  assert.match(h.split("value (text/html):\n")[1], /^<table><tr><td>x<\/td><\/tr>[^]*\[value \(text\/html\) cut: 16384 of 38015 characters kept\]$/);
});

test("figures are image content blocks of the ToolMessage", { skip }, async () => {
  const t = runCodeTool(client(), { language: "python", task: { session: session() } });
  const msg = await t.invoke(toolCall("run_code", { code: FIGURE + "Fig()" }));
  assert.deepEqual(msg.content.map((b) => b.type), ["text", "image", "image"]);
  assert.match(msg.content[0].text, /\[display 1: image\/png image 1\]\n\[value: image\/png image 2\]\nvalue \(text\/plain\):\n<Fig>/);
  // LangChain reads them as its standard image blocks.
  const images = msg.contentBlocks.filter((b) => b.type === "image");
  assert.equal(images.length, 2, JSON.stringify(msg.contentBlocks).slice(0, 300));
  for (const b of images) {
    assert.equal(b.mimeType, "image/png");
    assert.ok(isPNG(b.data));
  }
});

test("session and context: the model's calls share their globals", { skip }, async () => {
  const c = client();
  const sid = await c.sessions.create();
  try {
    const t = runCodeTool(c, { session: sid });
    assert.match(t.description, /globals that earlier calls left/);
    await t.invoke(toolCall("run_code", { code: "x = 6\ndef f(y): return x * y" }));
    const msg = await t.invoke(toolCall("run_code", { code: "f(7)" }));
    assert.equal(msg.artifact.value, "42", msg.content[0].text);
  } finally {
    await c.sessions.delete(sid);
  }
  const ctx = await c.context();
  try {
    const t = runCodeTool(c, { context: ctx });
    await t.invoke(toolCall("run_code", { code: "class C:\n    n = 1" }));
    const msg = await t.invoke(toolCall("run_code", { code: "C.n + 1" }));
    assert.equal(msg.artifact.value, "2", msg.content[0].text);
  } finally {
    await ctx.close();
  }
});

test("shellTools: exec_command and write_stdin in one live sandbox", { skip }, async () => {
  const c = client();
  const sb = await c.sandboxes.create({ timeout: "2m" });
  const shell = shellTools(c, { sandbox: sb });
  try {
    const [exec_command, write_stdin] = shell.tools;
    assert.deepEqual([exec_command.name, write_stdin.name], ["exec_command", "write_stdin"]);
    const a = await exec_command.invoke(toolCall("exec_command", { cmd: "echo hi > f.txt; cat f.txt; exit 5" }));
    assert.equal(a.content[0].text, "hi\n[exit code 5]");
    assert.deepEqual(a.artifact, { output: "hi\n", exit_code: 5 });
    // The sandbox is the caller's: the file is there.
    assert.equal((await sb.files.read("f.txt")).toString(), "hi\n");
    const r = await exec_command.invoke(toolCall("exec_command", { cmd: "cat", yield_time_ms: 200 }));
    const pid = r.artifact.process;
    assert.ok(pid > 0, r.content[0].text);
    const e = await write_stdin.invoke(toolCall("write_stdin", { process: pid, chars: "typed\n", close_stdin: true, yield_time_ms: 30000 }));
    assert.deepEqual(e.artifact, { output: "typed\n", exit_code: 0 });
    const gone = await write_stdin.invoke(toolCall("write_stdin", { process: pid }));
    assert.match(gone.content[0].text, /^write_stdin refused: no process/);
  } finally {
    await shell.close();
    // A sandbox given to the shell stays the caller's.
    assert.equal((await sb.get()).id, sb.id);
    await sb.close();
  }
});

test("shellTools: at most 32 processes followed at once", { skip }, async () => {
  const c = client();
  const shell = shellTools(c, { create: { timeout: "2m", limits: { pids: 512 } } });
  try {
    const [exec_command, write_stdin] = shell.tools;
    const pids = [];
    for (let i = 0; i < 32; i++) {
      const r = await exec_command.invoke(toolCall("exec_command", { cmd: "cat", yield_time_ms: 0 }));
      assert.ok(r.artifact.process > 0, `${i}: ${r.content[0].text}`);
      pids.push(r.artifact.process);
    }
    const over = await exec_command.invoke(toolCall("exec_command", { cmd: "echo 1", yield_time_ms: 0 }));
    assert.match(over.content[0].text, /^exec_command refused: 32 processes are still running/);
    const e = await write_stdin.invoke(toolCall("write_stdin", { process: pids[0], close_stdin: true, yield_time_ms: 30000 }));
    assert.equal(e.artifact.exit_code, 0, e.content[0].text);
    const ok = await exec_command.invoke(toolCall("exec_command", { cmd: "echo 1", yield_time_ms: 30000 }));
    assert.equal(ok.content[0].text, "1\n[exit code 0]");
  } finally {
    await shell.close();
  }
});
