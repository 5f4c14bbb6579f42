// agentrun/ai's tool, called as the AI SDK calls it (execute with the
// call's options), without a model, against the serve at
// AGENTRUN_TEST_ADDRESS.

import { test } from "node:test";
import assert from "node:assert/strict";
import { Client, AgentrunError } from "../dist/index.js";
import { runCodeTool, runCodeInput } from "../dist/ai.js";

const ADDRESS = process.env.AGENTRUN_TEST_ADDRESS;
const call = { toolCallId: "call-1", messages: [] };

test("the input schema", () => {
  assert.equal(runCodeInput.safeParse({ code: "print(1)", files: { "a.txt": "x" } }).success, true);
  assert.equal(runCodeInput.safeParse({ language: "python" }).success, false);
});

test("run_code through the AI SDK's execute", { skip: !ADDRESS && "no agentrun serve" }, async () => {
  const c = new Client(ADDRESS, { token: process.env.AGENTRUN_TEST_TOKEN || undefined });
  const t = runCodeTool(c, { language: "python", task: { timeout: "20s", session: "ts-ai" } });
  assert.equal(typeof t.description, "string");
  const out = await t.execute({ code: "print(open('in.txt').read().upper())", files: { "in.txt": "from the model" } }, call);
  assert.deepEqual([out.exit_code, out.stdout, out.timed_out], [0, "FROM THE MODEL\n", false]);
  const sh = await t.execute({ code: "echo $0; exit 4", language: "sh" }, call);
  assert.equal(sh.exit_code, 4);
  await assert.rejects(t.execute({ code: "print(1)", language: "cobol" }, call),
    (e) => e instanceof AgentrunError && e.status === 400 && e.field === "language");
});
