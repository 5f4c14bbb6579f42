// agentrun/ai's tools, called as the AI SDK calls them (execute with the
// call's options, toModelOutput), and in generateText's loop with a
// scripted model of ai/test (no network), against the serve at
// AGENTRUN_TEST_ADDRESS.

import { test } from "node:test";
import assert from "node:assert/strict";
import { generateText, stepCountIs } from "ai";
import { MockLanguageModelV4 } from "ai/test";
import { Client } from "../dist/index.js";
import { runCodeTool, runCodeInput, shellTools } from "../dist/ai.js";
import { FIGURE, TABLE, isPNG, session } from "../testdata/fixtures.mjs";
const ADDRESS = process.env.AGENTRUN_TEST_ADDRESS;
const skip = !ADDRESS && "no agentrun serve";
const call = { toolCallId: "call-1", messages: [] };
const client = () => new Client(ADDRESS, { token: process.env.AGENTRUN_TEST_TOKEN || undefined });

test("the input schema", () => {
  assert.equal(runCodeInput.safeParse({ code: "print(1)", files: { "a.txt": "x" } }).success, true);
  assert.equal(runCodeInput.safeParse({ language: "python" }).success, false);
});

test("run_code through the AI SDK's execute", { skip }, async () => {
  const t = runCodeTool(client(), { language: "python", task: { timeout: "20s", session: "ts-ai" } });
  assert.equal(typeof t.description, "string");
  const a = await t.execute({ code: "print(open('in.txt').read().upper())", files: { "in.txt": "from the model" } }, call);
  assert.deepEqual([a.output.exit_code, a.output.stdout, a.output.timed_out], [0, "FROM THE MODEL\n", false]);
  assert.deepEqual(await t.toModelOutput({ ...call, input: {}, output: a }), { type: "text", value: a.text });
  assert.match(a.text, /^stdout:\nFROM THE MODEL\n\[exit code 0, \d+ ms, no network; run ar-[^\]]+\]$/);
  const sh = await t.execute({ code: "echo $0; exit 4", language: "sh" }, call);
  assert.equal(sh.output.exit_code, 4);
  assert.match(sh.text, /\[exit code 4, /);
});

test("a refusal is the tool's text, with its field, and no stack", { skip }, async () => {
  const t = runCodeTool(client(), { task: { session: session() } });
  const a = await t.execute({ code: "print(1)", language: "cobol" }, call);
  assert.equal(a.error, true);
  assert.match(a.text, /^run_code refused \(400\): language: /);
  assert.doesNotMatch(a.text, /\n\s+at /);
  assert.deepEqual(await t.toModelOutput({ ...call, input: {}, output: a }), { type: "error-text", value: a.text });
});

test("the value: text/plain, and text/html cut to a bound, the cut said", { skip }, async () => {
  const t = runCodeTool(client(), { language: "python", task: { session: session() } });
  const a = await t.execute({ code: "x = 6\nx * 7" }, call);
  assert.equal(a.output.value, "42");
  assert.match(a.text, /\nvalue \(text\/plain\):\n42$/);
  const h = await t.execute({ code: TABLE }, call);
  assert.match(h.text, /value \(text\/plain\):\nTable\(2000 rows\)\n/);
  const html = h.text.split("value (text/html):\n")[1];
  assert.ok(html.startsWith("<table><tr><td>x</td></tr>"), h.text.slice(0, 300));
  assert.match(html, /\[value \(text\/html\) cut: 16384 of 38015 characters kept\]$/);
  assert.ok(h.text.length < 20000, String(h.text.length));
});

test("figures reach the model as image parts", { skip }, async () => {
  const t = runCodeTool(client(), { language: "python", task: { session: session() } });
  const a = await t.execute({ code: FIGURE + "Fig()" }, call);
  assert.equal(a.figures.length, 2, a.text);
  const mo = await t.toModelOutput({ ...call, input: {}, output: a });
  assert.equal(mo.type, "content");
  assert.deepEqual(mo.value.map((p) => p.type), ["text", "file", "file"]);
  assert.match(mo.value[0].text, /stdout:\ndrawn\n[^]*\[display 1: image\/png image 1\]\n\[value: image\/png image 2\]\nvalue \(text\/plain\):\n<Fig>/);
  for (const p of mo.value.slice(1)) {
    assert.equal(p.mediaType, "image/png");
    assert.equal(p.data.type, "data");
    assert.ok(isPNG(p.data.data));
  }

  // In generateText's loop: the model's second step is sent the figure
  // as an image of the tool's result.
  const prompts = [];
  const model = new MockLanguageModelV4({
    doGenerate: async (options) => {
      prompts.push(options.prompt);
      const usage = { inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 }, outputTokens: { total: 1, text: 1, reasoning: 0 } };
      if (prompts.length === 1) {
        return {
          content: [{ type: "tool-call", toolCallId: "tc-1", toolName: "run_code", input: JSON.stringify({ code: FIGURE }) }],
          finishReason: { unified: "tool-calls", raw: "tool_calls" }, usage, warnings: [],
        };
      }
      return { content: [{ type: "text", text: "done" }], finishReason: { unified: "stop", raw: "stop" }, usage, warnings: [] };
    },
  });
  const res = await generateText({ model, tools: { run_code: t }, prompt: "draw", stopWhen: stepCountIs(3) });
  assert.equal(res.text, "done");
  const result = prompts[1].flatMap((m) => (m.role === "tool" ? m.content : [])).find((p) => p.type === "tool-result");
  assert.ok(result, JSON.stringify(prompts[1]).slice(0, 500));
  assert.equal(result.output.type, "content");
  const images = result.output.value.filter((p) => p.type !== "text");
  assert.equal(images.length, 1, JSON.stringify(result.output).slice(0, 500));
  assert.match(JSON.stringify(images[0]), /image/);
});

test("session and context: the model's calls share their globals", { skip }, async () => {
  const c = client();
  const sid = await c.sessions.create();
  try {
    const t = runCodeTool(c, { session: sid });
    assert.match(t.description, /globals that earlier calls left/);
    const first = await t.execute({ code: "x = 6\ndef f(y): return x * y" }, call);
    assert.equal(first.output.exit_code, 0, first.text);
    assert.match(first.text, /\[state kept: [^\]]*\bx\b/);
    const a = await t.execute({ code: "f(7)" }, call);
    assert.equal(a.output.value, "42", a.text);
  } finally {
    await c.sessions.delete(sid);
  }
  const ctx = await c.context();
  try {
    const t = runCodeTool(c, { context: ctx });
    await t.execute({ code: "import json\nseen = [1]" }, call);
    const a = await t.execute({ code: "seen.append(2); json.dumps(seen)" }, call);
    assert.equal(a.output.value, "'[1, 2]'", a.text);
  } finally {
    await ctx.close();
  }
});

test("shellTools: exec_command and write_stdin in one live sandbox", { skip }, async () => {
  const c = client();
  const shell = shellTools(c, { create: { timeout: "2m" } });
  try {
    const { exec_command, write_stdin } = shell.tools;
    const a = await exec_command.execute({ cmd: "echo hi; echo err >&2; echo kept > f.txt; exit 3" }, call);
    // stdout and stderr as they came: two pipes, in either order.
    assert.deepEqual([a.output.split("\n").sort(), a.exit_code, a.process], [["", "err", "hi"], 3, undefined], a.text);
    assert.deepEqual(await exec_command.toModelOutput({ ...call, input: {}, output: a }), { type: "text", value: a.output + "[exit code 3]" });
    const b = await exec_command.execute({ cmd: "pwd", workdir: "/tmp" }, call);
    assert.equal(b.output, "/tmp\n", b.text);
    const b2 = await exec_command.execute({ cmd: "cat f.txt" }, call);
    assert.equal(b2.output, "kept\n", b2.text);

    // A command still running: its id, then what it prints as stdin feeds it.
    const r = await exec_command.execute({ cmd: "echo ready; while read l; do echo \"got $l\"; done; echo bye", yield_time_ms: 300 }, call);
    assert.equal(r.exit_code, undefined, r.text);
    assert.ok(r.process > 0, r.text);
    assert.match(r.text, /still running: write_stdin with process \d+/);
    // Output comes when the process prints it: read (empty chars) until it has.
    const until = async (first, want) => {
      let out = first.output;
      for (let i = 0; i < 100 && !want(out); i++) {
        const more = await write_stdin.execute({ process: r.process, yield_time_ms: 300 }, call);
        assert.equal(more.process, r.process, more.text);
        out += more.output;
      }
      return out;
    };
    assert.equal(await until(r, (o) => o.includes("\n")), "ready\n");
    const w = await write_stdin.execute({ process: r.process, chars: "one\n", yield_time_ms: 300 }, call);
    assert.equal(w.process, r.process, w.text);
    assert.equal(await until(w, (o) => o.includes("\n")), "got one\n");
    const e = await write_stdin.execute({ process: r.process, chars: "two\n", close_stdin: true, yield_time_ms: 30000 }, call);
    assert.deepEqual([e.output, e.exit_code, e.process], ["got two\nbye\n", 0, undefined], e.text);
    const gone = await write_stdin.execute({ process: r.process, chars: "x" }, call);
    assert.equal(gone.error, true);
    assert.match(gone.text, /^write_stdin refused: no process \d+ is running/);
    assert.equal((await exec_command.toModelOutput({ ...call, input: {}, output: gone })).type, "error-text");

    const sb = await shell.shell.sandbox();
    assert.equal((await c.sandboxes.list()).filter((s) => s.id === sb.id).length, 1);
    await shell.close();
    assert.equal((await c.sandboxes.list()).filter((s) => s.id === sb.id).length, 0);
  } finally {
    await shell.close();
  }
});

test("shellTools: a sandbox it made is kept alive by each call, and made again, said, once it ended", { skip }, async () => {
  const c = client();
  const shell = shellTools(c, { create: { timeout: "3s" } });
  try {
    const { exec_command } = shell.tools;
    const a = await exec_command.execute({ cmd: "echo kept > f.txt" }, call);
    assert.equal(a.exit_code, 0, a.text);
    const first = await shell.shell.sandbox();
    // Each call sets its lifetime again from now.
    const before = Date.parse((await first.get()).expires_at);
    await new Promise((r) => setTimeout(r, 1100));
    assert.equal((await exec_command.execute({ cmd: "cat f.txt" }, call)).output, "kept\n");
    assert.ok(Date.parse((await first.get()).expires_at) > before);
    // Left idle past its lifetime, it ends; the next call makes another and says so.
    for (let i = 0; i < 120 && (await c.sandboxes.list()).some((s) => s.id === first.id); i++) {
      await new Promise((r) => setTimeout(r, 500));
    }
    assert.ok(!(await c.sandboxes.list()).some((s) => s.id === first.id), "the sandbox did not end");
    const b = await exec_command.execute({ cmd: "cat f.txt" }, call);
    assert.match(b.text, /^\[the sandbox had ended [^\]]*: this is a new one, without the last one's files and processes\]\ncat: /);
    assert.notEqual((await shell.shell.sandbox()).id, first.id);
  } finally {
    await shell.close();
  }
});

test("shellTools: with tty each command has a terminal, Ctrl-C through it; without, Ctrl-C is SIGINT", { skip }, async () => {
  const c = client();
  const term = shellTools(c, { create: { timeout: "2m" }, tty: true });
  try {
    const { exec_command, write_stdin } = term.tools;
    assert.match(write_stdin.description, /has a terminal/);
    const r = await exec_command.execute({ cmd: "tty; cat", yield_time_ms: 500 }, call);
    assert.ok(r.process > 0, r.text);
    // The terminal echoes ^C and its line discipline sends the group SIGINT.
    const e = await write_stdin.execute({ process: r.process, chars: "\u0003", yield_time_ms: 10000 }, call);
    assert.equal(e.signal, "SIGINT", e.text);
    assert.match(r.output + e.output, /^\/dev\/pts\/\d+\r\n\^C/);
  } finally {
    await term.close();
  }
  const plain = shellTools(c, { create: { timeout: "2m" } });
  try {
    const { exec_command, write_stdin } = plain.tools;
    assert.match(write_stdin.description, /There is no terminal/);
    // The signal goes to the process the shell started: cat, by exec.
    const r = await exec_command.execute({ cmd: "tty; exec cat", yield_time_ms: 500 }, call);
    assert.match(r.output, /^not a tty\n/, r.text);
    const e = await write_stdin.execute({ process: r.process, chars: "\u0003", yield_time_ms: 10000 }, call);
    assert.deepEqual([e.signal, e.exit_code], ["SIGINT", undefined], e.text);
    assert.match(e.text, /\[killed by SIGINT\]$/);
  } finally {
    await plain.close();
  }
});
