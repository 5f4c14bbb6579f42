// elicit.mjs drives `agentrun mcp` over stdio with the official TypeScript
// SDK's client, answering its elicitations as a person in Claude Desktop
// or Cursor would:
//
//   node elicit.mjs ANSWERS ARGUMENTS COMMAND [ARGS...]
//
// ANSWERS is a comma-separated list, one per elicitation in order, of
// "accept" (approve: true), "reject" (accept with approve: false) or
// "decline"; "none" offers no elicitation at all. ARGUMENTS is the JSON of
// one run_code call's arguments. It prints one JSON line: {"asked": the
// elicitations' messages, "tools": run_code's schema of its tools
// argument, "result": the call's result} and exits 0, or prints what is
// wrong and exits 1.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { CallToolResultSchema, ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const [answers, args, command, ...rest] = process.argv.slice(2);
if (!command) {
  console.log("usage: node elicit.mjs ANSWERS ARGUMENTS COMMAND [ARGS...]");
  process.exit(2);
}

const offer = answers !== "none";
const queue = offer ? answers.split(",") : [];
const asked = [];
const client = new Client({ name: "agentrun-ts-elicit-test", version: "0.0.0" },
  { capabilities: offer ? { elicitation: {} } : {} });
if (offer) {
  client.setRequestHandler(ElicitRequestSchema, async (req) => {
    asked.push(req.params.message);
    const answer = queue.shift() ?? "decline";
    if (answer === "accept") return { action: "accept", content: { approve: true } };
    if (answer === "reject") return { action: "accept", content: { approve: false } };
    return { action: "decline" };
  });
}

try {
  await client.connect(new StdioClientTransport({ command, args: rest, stderr: "inherit" }));
  const { tools } = await client.listTools();
  const runCode = tools.find((t) => t.name === "run_code");
  // A plain request, not callTool: an answer that breaks run_code's output
  // schema is printed for the test to say so, not thrown away.
  const result = await client.request({ method: "tools/call", params: { name: "run_code", arguments: JSON.parse(args) } },
    CallToolResultSchema, { timeout: 120000 });
  console.log(JSON.stringify({ asked, tools: runCode.inputSchema.properties.tools, result }));
  await client.close();
} catch (e) {
  console.log(`FAIL: ${e && e.stack ? e.stack : e}`);
  process.exit(1);
}
