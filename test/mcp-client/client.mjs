// client.mjs drives agentrun's MCP server with the official TypeScript
// SDK's client, as Claude Desktop or Cursor would:
//
//   node client.mjs stdio COMMAND [ARGS...]   spawn `agentrun mcp` and speak over stdio
//   node client.mjs http URL [TOKEN]          speak Streamable HTTP to serve's /mcp
//
// It checks tools/list and a few run_code calls, prints "ok MODE" and exits
// 0, or prints what is wrong and exits 1.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [mode, target, ...rest] = process.argv.slice(2);

function check(cond, what, got) {
  if (!cond) {
    console.log(`FAIL ${mode}: ${what}: ${JSON.stringify(got)}`);
    process.exit(1);
  }
}

let transport;
if (mode === "stdio") {
  transport = new StdioClientTransport({ command: target, args: rest, stderr: "inherit" });
} else if (mode === "http") {
  const headers = rest[0] ? { Authorization: `Bearer ${rest[0]}` } : {};
  transport = new StreamableHTTPClientTransport(new URL(target), { requestInit: { headers } });
} else {
  console.log("usage: node client.mjs stdio COMMAND [ARGS...] | http URL [TOKEN]");
  process.exit(2);
}

const client = new Client({ name: "agentrun-ts-test", version: "0.0.0" });
await client.connect(transport);

const { tools } = await client.listTools();
const names = tools.map((t) => t.name).sort().join(",");
check(names === "exec_command,fork_session,list_files,new_session,read_file,run_code,write_file,write_stdin", "tools/list", names);
const schema = tools.find((t) => t.name === "run_code").inputSchema;
check(schema.properties.language.enum.includes("python"), "language enum", schema.properties.language);
check(schema.required.includes("code"), "required", schema.required);
// Not offered with none configured: no tools or network_services argument.
check(!("tools" in schema.properties) && !("network_services" in schema.properties), "arguments not offered", schema.properties);
const runCodeTool = tools.find((t) => t.name === "run_code");
check(/final expression/.test(runCodeTool.description) && /plt\.show\(\)/.test(runCodeTool.description), "values and figures told", runCodeTool.description);

// A kept session: a file written by the client is read by a run in it,
// whose file the client reads back (structured results validated by the SDK).
let res0;
const made = await client.callTool({ name: "new_session", arguments: {} });
const sid = made.structuredContent && made.structuredContent.session;
check(!made.isError && /^ss-[0-9a-f]{32}$/.test(sid), "new_session", made);
res0 = await client.callTool({ name: "write_file", arguments: { session: sid, path: "in.txt", content: "hi" } });
check(!res0.isError, "write_file", res0);
res0 = await client.callTool({ name: "run_code", arguments: { session: sid, code: "open('out.txt','w').write(open('in.txt').read()*2)" } });
check(!res0.isError && res0.structuredContent.exit_code === 0, "run_code in a session", res0);
res0 = await client.callTool({ name: "read_file", arguments: { session: sid, path: "out.txt" } });
check(!res0.isError && res0.content[0].text === "hihi", "read_file", res0);
res0 = await client.callTool({ name: "list_files", arguments: { session: sid } });
check(!res0.isError && res0.structuredContent.files.some((f) => f.name === "out.txt"), "list_files", res0);

// A happy path, checked through the structured result the SDK validated
// against the tool's output schema.
let res = await client.callTool({ name: "run_code", arguments: { code: "print(45)" } });
check(!res.isError && res.content[0].type === "text" && res.content[0].text.includes("45"), "print(45)", res);
check(res.structuredContent.stdout === "45\n" && res.structuredContent.exit_code === 0, "structuredContent", res.structuredContent);

// A non-zero exit is a normal answer.
res = await client.callTool({ name: "run_code", arguments: { code: "import sys; sys.exit(3)" } });
check(!res.isError && res.structuredContent.exit_code === 3 && res.content[0].text.includes("exit code 3"), "exit 3", res);

// A refusal the model can fix, naming the argument and the maximum.
res = await client.callTool({ name: "run_code", arguments: { code: "print(1)", timeout: "5m" } });
check(res.isError && /timeout: 5m exceeds policy maximum/.test(res.content[0].text), "over policy", res);

// Wrong types: an error answer, not a broken session.
res = await client.callTool({ name: "run_code", arguments: { code: 42 } });
check(res.isError, "wrong type", res);

// A collected image comes back as image content.
const png = "import base64, os; os.makedirs('out', exist_ok=True); open('out/dot.png','wb').write(base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC'))";
res = await client.callTool({ name: "run_code", arguments: { code: png, collect: ["out/*.png"] } });
check(!res.isError && res.content.some((c) => c.type === "image" && c.mimeType === "image/png"), "image", res.content.map((c) => c.type));

// The live sandbox of the session: a command that ends within its yield
// time answers its output and exit code; one that does not, its process,
// which write_stdin with empty chars follows to its end.
res = await client.callTool({ name: "exec_command", arguments: { cmd: "echo hi > f; cat f" } });
check(!res.isError && res.structuredContent.output === "hi\n" && res.structuredContent.exit_code === 0, "exec_command", res);
res = await client.callTool({ name: "exec_command", arguments: { cmd: "sleep 1; cat f", yield_time_ms: 100 } });
const pid = res.structuredContent && res.structuredContent.process;
check(!res.isError && pid > 0 && res.structuredContent.exit_code === undefined, "exec_command still running", res);
res = await client.callTool({ name: "write_stdin", arguments: { process: pid, chars: "", yield_time_ms: 20000 } });
check(!res.isError && res.structuredContent.output === "hi\n" && res.structuredContent.exit_code === 0, "write_stdin", res);

await client.close();
console.log(`ok ${mode}`);
