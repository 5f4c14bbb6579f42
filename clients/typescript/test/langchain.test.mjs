// agentrun/langchain's tool, called as LangChain calls it (invoke),
// without a model, against the serve at AGENTRUN_TEST_ADDRESS.

import { test } from "node:test";
import assert from "node:assert/strict";
import { Client, AgentrunError } from "../dist/index.js";
import { runCodeTool } from "../dist/langchain.js";

const ADDRESS = process.env.AGENTRUN_TEST_ADDRESS;

test("run_code through LangChain's invoke", { skip: !ADDRESS && "no agentrun serve" }, async () => {
  const c = new Client(ADDRESS, { token: process.env.AGENTRUN_TEST_TOKEN || undefined });
  const t = runCodeTool(c, { task: { session: "ts-langchain" } });
  assert.equal(t.name, "run_code");
  const out = JSON.parse(await t.invoke({ code: "import sys; print(open('in.txt').read()); sys.exit(2)", language: "python", files: { "in.txt": "lc" } }));
  assert.deepEqual([out.exit_code, out.stdout], [2, "lc\n"]);
  // A tool call as a model sends it: the answer is a ToolMessage.
  const msg = await t.invoke({ type: "tool_call", id: "call-1", name: "run_code", args: { code: "print(6*7)" } });
  assert.equal(msg.tool_call_id, "call-1");
  assert.equal(JSON.parse(msg.content).stdout, "42\n");
  // What the schema refuses never reaches the server.
  await assert.rejects(t.invoke({ language: "python" }), /schema|code/i);
  await assert.rejects(t.invoke({ code: "print(1)", language: "cobol" }),
    (e) => e instanceof AgentrunError && e.status === 400 && e.field === "language");
});
