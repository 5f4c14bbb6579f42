// Tests of the client. Those of ServeTest need a real agentrun serve at
// AGENTRUN_TEST_ADDRESS (with AGENTRUN_TEST_TOKEN when it has one), as
// test/integration's TestTypeScriptClient starts; POSTs to
// AGENTRUN_TEST_SERVICE_URL are held for approval.

import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import * as http from "node:http";
import { Client, AgentrunError, TransportError, toTask, quote } from "../dist/index.js";

const ADDRESS = process.env.AGENTRUN_TEST_ADDRESS;
const TOKEN = process.env.AGENTRUN_TEST_TOKEN || undefined;
const SERVICE_URL = process.env.AGENTRUN_TEST_SERVICE_URL;
const root = join(dirname(fileURLToPath(import.meta.url)), "..");

/** A session name of a test's own: the quota counts per session. */
export const session = () => "ts-" + Math.random().toString(16).slice(2, 14);

/** Awaits fn's refusal with status and returns the error. */
export async function refused(status, fn) {
  let err;
  try {
    await fn();
  } catch (e) {
    err = e;
  }
  assert.ok(err instanceof AgentrunError, `want an AgentrunError ${status}, got ${err}`);
  assert.equal(err.status, status, String(err));
  assert.ok(err.message, String(err));
  return err;
}

/** A server of the test's own that answers every request with answer(req, res). */
async function fakeServer(answer) {
  const srv = http.createServer(answer);
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${srv.address().port}`, close: () => { srv.closeAllConnections(); srv.close(); } };
}

describe("client", () => {
  test("openapi.ts is what openapi-typescript makes of the document", () => {
    const out = join(mkdtempSync(join(tmpdir(), "openapi-")), "openapi.ts");
    execFileSync(join(root, "node_modules", ".bin", "openapi-typescript"),
      [join(root, "..", "..", "internal", "server", "openapi.json"), "-o", out], { stdio: "pipe" });
    assert.ok(readFileSync(out, "utf8") === readFileSync(join(root, "src", "openapi.ts"), "utf8"),
      "src/openapi.ts differs from the document's types: run npm run openapi");
  });

  test("task.ts is what scripts/task.mjs makes of the document", () => {
    const out = join(mkdtempSync(join(tmpdir(), "task-")), "task.ts");
    execFileSync(process.execPath, [join(root, "scripts", "task.mjs"),
      join(root, "..", "..", "internal", "server", "openapi.json"), out], { stdio: "pipe" });
    assert.ok(readFileSync(out, "utf8") === readFileSync(join(root, "src", "task.ts"), "utf8"),
      "src/task.ts differs from the document's task fields: run npm run openapi");
  });

  test("task fields", () => {
    assert.deepEqual(toTask({ code: "x", files: { a: "t", b: new Uint8Array([0, 255]), c: { content: "y" } }, timeout: 1.5 }),
      { code: "x", files: { a: { content: "t" }, b: { content_base64: "AP8=" }, c: { content: "y" } }, limits: { timeout: "1.5s" } });
    assert.deepEqual(toTask({ code: "x", limits: { memory: "64m" }, timeout: "5s", stdin: undefined }),
      { code: "x", limits: { memory: "64m", timeout: "5s" } });
    assert.throws(() => toTask({ code: "x", cmd: ["y"] }), /unknown task field\(s\): cmd/);
    assert.deepEqual(toTask({ code: "x", tools: ["github"] }), { code: "x", tools: ["github"] });
  });

  test("every task property of the document is a run option", () => {
    const doc = JSON.parse(readFileSync(join(root, "..", "..", "internal", "server", "openapi.json"), "utf8"));
    const props = Object.keys(doc.components.schemas.Task.properties);
    assert.ok(props.includes("tools"), `Task's properties ${props}`);
    for (const p of props) assert.doesNotThrow(() => toTask({ code: "x", [p]: null }), `task field ${p}`);
  });

  test("a context's tools go with each of its runs, unless a run names its own", async () => {
    const sent = [];
    const c = new Client("http://127.0.0.1:1");
    c.run = async (task) => { sent.push(task); return {}; };
    c.stream = (task) => { sent.push(task); return (async function* () {})(); };
    const ctx = await c.context("ss-" + "0".repeat(32), { tools: ["github"] });
    await ctx.run("x = 1");
    await ctx.run("x", { tools: ["docs"] });
    for await (const _ of ctx.stream("x")) { /* nothing */ }
    assert.deepEqual(sent.map((t) => t.tools), [["github"], ["docs"], ["github"]]);
    assert.ok(sent.every((t) => t.session === ctx.id && t.keep_state), JSON.stringify(sent));
    await (await c.context("ss-" + "0".repeat(32))).run("y");
    assert.equal(sent.at(-1).tools, undefined);
  });

  test("addresses", () => {
    assert.throws(() => new Client("ftp://x"), /want unix:\/\/\/path/);
    assert.throws(() => new Client("not a url"), /want unix:\/\/\/path/);
    assert.throws(() => new Client("http://x:1", { retries: -1 }), /retries/);
    assert.equal(new Client("unix:///run/x.sock").address, "unix:///run/x.sock");
  });

  test("file names are one segment", () => {
    assert.equal(quote("../a/b.txt"), "%2E%2E%2Fa%2Fb%2Etxt");
  });

  test("a stream cut before its result throws", async (t) => {
    const s = await fakeServer((req, res) => {
      res.writeHead(200, { "Content-Type": "application/x-ndjson" });
      res.write('{"event":"stdout","data":"a"}\n{"event":"std');
      setTimeout(() => res.socket.destroy(), 50);
    });
    t.after(s.close);
    const events = [];
    await assert.rejects(async () => {
      for await (const ev of new Client(s.url).stream({ code: "x" })) events.push(ev);
    }, (e) => e instanceof TransportError && /stream cut|without its end/.test(e.message));
    assert.deepEqual(events, [{ event: "stdout", data: "a" }]);
  });

  test("onApproval gets a held tool call's kind, tool server, tool and arguments, and decides it", async (t) => {
    const held = { id: "ap-t", kind: "tool", service: "github", tool: "create_issue\\n", arguments: '{"title":"\\u202ex"}',
      method: "", url: "", body_excerpt: "" };
    const decided = [];
    const s = await fakeServer((req, res) => {
      let body = "";
      req.on("data", (c) => (body += c));
      req.on("end", () => {
        if (req.url === "/v1/runs?stream=1") {
          res.writeHead(200, { "Content-Type": "application/x-ndjson" });
          res.write(JSON.stringify({ event: "approval", run: "ar-1", approval: held }) + "\n");
          const wait = setInterval(() => {
            if (decided.length === 0) return;
            clearInterval(wait);
            res.end(JSON.stringify({ event: "result", result: { id: "ar-1", error: "" } }) + "\n");
          }, 10);
          return;
        }
        decided.push([req.method, req.url, JSON.parse(body)]);
        res.writeHead(200, { "Content-Type": "application/json" });
        res.end(JSON.stringify({ run: "ar-1", id: "ap-t", approved: true }));
      });
    });
    t.after(s.close);
    const asked = [];
    for await (const ev of new Client(s.url).stream({ code: "x" }, { onApproval: (a) => { asked.push(a); return a.kind === "tool"; } })) {
      void ev;
    }
    assert.deepEqual(asked, [{ ...held, run: "ar-1" }]);
    assert.deepEqual(decided, [["POST", "/v1/runs/ar-1/approvals/ap-t", { approve: true }]]);
  });

  test("an answer shorter than its length throws", async (t) => {
    const s = await fakeServer((req, res) => {
      res.writeHead(200, { "Content-Type": "application/json", "Content-Length": "100" });
      res.write('{"id": "ar-1"');
      setTimeout(() => res.socket.destroy(), 50);
    });
    t.after(s.close);
    await assert.rejects(new Client(s.url).run({ code: "x" }), TransportError);
  });

  test("no answer times out", async (t) => {
    const s = await fakeServer(() => {});
    t.after(s.close);
    await assert.rejects(new Client(s.url, { timeoutMs: 300 }).health(),
      (e) => e instanceof TransportError && /no whole answer within 0.3 s/.test(e.message));
  });

  test("a 503 is retried only when asked", async (t) => {
    let n = 0;
    const s = await fakeServer((req, res) => {
      n++;
      if (n === 1 || n === 2) {
        res.writeHead(503, { "Content-Type": "application/json", "Retry-After": "0" });
        res.end('{"error": "busy"}');
        return;
      }
      res.writeHead(200, { "Content-Type": "application/json" });
      res.end('{"id": "ar-1", "exit_code": 0, "stdout": "ok"}');
    });
    t.after(s.close);
    const e = await refused(503, () => new Client(s.url).run({ code: "x" }));
    assert.equal(e.retryAfter, 0);
    assert.equal(n, 1);
    const r = await new Client(s.url, { retries: 3 }).run({ code: "x" });
    assert.equal(r.stdout, "ok");
    assert.equal(n, 3);
  });
});

describe("serve", { skip: !ADDRESS && "no agentrun serve (AGENTRUN_TEST_ADDRESS)" }, () => {
  const c = new Client(ADDRESS, { token: TOKEN, runTimeoutMs: 120_000 });

  test("health", async () => {
    assert.equal((await c.health()).status, "ok");
    assert.equal((await c.openapi()).openapi, "3.1.0");
  });

  test("run", async () => {
    let r = await c.run({
      code: "import sys\nprint(sys.stdin.read(), open('a.csv').read(), len(open('b.bin', 'rb').read()))",
      language: "python", files: { "a.csv": "x,y", "b.bin": new Uint8Array([0, 255, 0]) }, stdin: "in",
      timeout: "10s", session: session(),
    });
    assert.deepEqual([r.stdout, r.exit_code, r.error], ["in x,y 3\n", 0, ""]);
    // The program's own failure is a result, not an error.
    r = await c.run({ code: "import sys; sys.exit(3)", session: session() });
    assert.equal(r.exit_code, 3);
    r = await c.run({ code: "while True: pass", timeout: 0.5, session: session() });
    assert.equal(r.timed_out, true);
  });

  test("stream", async () => {
    const events = [];
    for await (const ev of c.stream({ code: "import sys, time\nprint('a', flush=True)\ntime.sleep(0.3)\nprint('b', file=sys.stderr)", session: session() })) {
      events.push(ev);
    }
    assert.equal(events.at(-1).event, "result");
    const text = (kind) => events.filter((e) => e.event === kind).map((e) => e.data).join("");
    assert.deepEqual([text("stdout"), text("stderr")], ["a\n", "b\n"]);
    assert.equal(events.at(-1).result.stdout, "a\n");
  });

  test("approvals through onApproval", { skip: !SERVICE_URL && "no service held for approval" }, async () => {
    const code = [
      "import urllib.request, urllib.error",
      "for i in (1, 2):",
      `    req = urllib.request.Request(${JSON.stringify(SERVICE_URL)} + str(i), data=b'body', method='POST')`,
      "    try:",
      "        r = urllib.request.urlopen(req, timeout=30)",
      "        print(r.status, r.read().decode())",
      "    except urllib.error.HTTPError as e:",
      "        print(e.code, e.read().decode().strip())",
    ].join("\n");
    const asked = [];
    const events = [];
    const onApproval = async (a) => {
      asked.push(a);
      return asked.length === 1; // the first approved, the second denied
    };
    for await (const ev of c.stream({ code, network: { services: ["api"] }, timeout: "30s", session: session() }, { onApproval })) {
      events.push(ev);
    }
    assert.equal(asked.length, 2);
    const a = asked[0];
    assert.deepEqual([a.method, a.url, a.body_excerpt], ["POST", SERVICE_URL + "1", "body"]);
    assert.ok(a.run.startsWith("ar-") && a.id, JSON.stringify(a));
    const res = events.at(-1).result;
    const lines = res.stdout.split("\n");
    assert.match(lines[0], /^200 /);
    assert.equal(lines[1], "403 agentrun: denied by the operator");
    assert.deepEqual(res.network.approvals.map((x) => [x.approved, x.by]),
      [[true, "operator (serve API)"], [false, "operator (serve API)"]]);
    // Decided already: nothing waits.
    const e = await refused(404, () => c.approve(a.run, a.id, true));
    assert.equal(e.field, undefined);
  });

  test("sessions", async () => {
    const s = c.sessions;
    const sid = await s.create();
    assert.match(sid, /^ss-/);
    try {
      await s.write(sid, "in/a.txt", new TextEncoder().encode("from the client"));
      assert.equal((await s.read(sid, "in/a.txt")).toString(), "from the client");
      const r = await c.run({ code: "print(open('in/a.txt').read()); open('out.txt', 'w').write('from the run')", session: sid, keep_workspace: true });
      assert.equal(r.stdout, "from the client\n");
      const names = Object.fromEntries((await s.files(sid)).map((f) => [f.name, f.type]));
      assert.deepEqual([names["in"], names["in/a.txt"], names["out.txt"]], ["dir", "file", "file"]);
      assert.equal((await s.read(sid, "out.txt")).toString(), "from the run");
      assert.equal((await s.get(sid)).id, sid);
      await refused(400, () => s.read(sid, "../etc/passwd"));
      const fork = await s.fork(sid, 2);
      const copies = fork.sessions.map((x) => x.id);
      assert.ok(["reflink", "copy"].includes(fork.copy), fork.copy);
      try {
        assert.equal(new Set([...copies, sid]).size, 3);
        for (const id of copies) assert.equal((await s.read(id, "out.txt")).toString(), "from the run");
        await c.run({ code: "open('out.txt', 'w').write('copy 0')", session: copies[0], keep_workspace: true });
        assert.equal((await s.read(copies[0], "out.txt")).toString(), "copy 0");
        assert.equal((await s.read(copies[1], "out.txt")).toString(), "from the run");
        const e = await refused(400, () => s.fork(sid, 65));
        assert.equal(e.field, "count");
      } finally {
        for (const id of copies) await s.delete(id);
      }
    } finally {
      await s.delete(sid);
    }
    await refused(404, () => s.read(sid, "in/a.txt"));
    await refused(404, () => s.files(sid));
    await refused(404, () => s.delete(sid));
    await refused(404, () => s.fork(sid, 1));
    const e = await refused(404, () => c.run({ code: "print(1)", session: sid, keep_workspace: true }));
    assert.equal(e.field, "session");
  });

  test("contexts", async () => {
    // Each session has its own 3 runs a minute: the forks give more.
    const ctx = await c.context();
    assert.match(ctx.id, /^ss-/);
    let r = await ctx.run("x = 1");
    assert.equal(r.exit_code, 0, r.stderr);
    assert.equal(r.state.saved, true, JSON.stringify(r.state));
    assert.ok(r.state.kept.includes("x"), JSON.stringify(r.state));
    r = await ctx.run("x + 1");
    assert.equal(r.value?.["text/plain"], "2", JSON.stringify(r));
    const [a, b] = await ctx.fork(2);
    try {
      assert.equal(new Set([ctx.id, a.id, b.id]).size, 3);
      // A fork starts with the state; its change stays its own.
      r = await a.run("x = x + 10");
      assert.equal(r.exit_code, 0, r.stderr);
      const events = [];
      for await (const ev of a.stream("print(x)", { timeout: "30s" })) events.push(ev);
      assert.equal(events.filter((e) => e.event === "stdout").map((e) => e.data).join(""), "11\n");
      assert.ok(events.at(-1).result.state.kept.includes("x"), JSON.stringify(events.at(-1)));
      r = await ctx.run("x");
      assert.equal(r.value?.["text/plain"], "1", JSON.stringify(r));
      // reset: the next run starts with no globals; what cannot carry is named.
      await b.reset();
      r = await b.run("fh = open('/dev/null')\ny = 2\n'x' in globals()");
      assert.equal(r.value?.["text/plain"], "False", JSON.stringify(r));
      assert.deepEqual(r.state.kept, ["y"], JSON.stringify(r.state));
      assert.ok(r.state.dropped.fh, JSON.stringify(r.state));
      // A context of a session it did not make leaves it at the end of a block.
      await (await c.context(b.id))[Symbol.asyncDispose]();
      assert.equal((await c.sessions.get(b.id)).id, b.id);
    } finally {
      await a.close();
      await b.close();
    }
    await refused(404, () => c.sessions.get(a.id));
    await ctx[Symbol.asyncDispose]();
    await refused(404, () => c.sessions.get(ctx.id));
  });

  test("refusals", async () => {
    let e = await refused(400, () => c.run({ code: "print(1)", limits: { memory: "lots" }, session: session() }));
    assert.equal(e.field, "limits.memory");
    e = await refused(403, () => c.run({ code: "print(1)", timeout: "1h", session: session() }));
    assert.equal(e.field, "limits.timeout");
    e = await refused(400, async () => { for await (const _ of c.stream({ code: "print(1)", limits: { pids: -1 } })) { /* */ } });
    assert.equal(e.field, "limits.pids");
    // agentrun could not run it: 500, with the result.
    e = await refused(500, () => c.run({ command: ["/no/such/program"], session: session() }));
    assert.ok(e.result.id.startsWith("ar-") && e.result.error);
    e = await refused(500, async () => { for await (const _ of c.stream({ command: ["/no/such/program"], session: session() })) { /* */ } });
    assert.ok(e.result.error);
  });

  test("quota", async () => {
    const sess = session();
    for (let i = 0; i < 3; i++) await c.run({ code: "print(1)", session: sess });
    const e = await refused(429, () => c.run({ code: "print(1)", session: sess }));
    assert.match(e.message, /quota/);
    assert.ok(e.retryAfter > 0, String(e.retryAfter));
  });

  test("sandboxes", async () => {
    // A live sandbox: exec to its end, a process spawned and fed, files
    // both ways, its timeout, its port's URL; disposed of (as the end of
    // an `await using` block does: Node 20 has no syntax for it), it is
    // gone.
    const sb = await c.sandboxes.create({ timeout: "2m" });
    const id = sb.id;
    try {
      assert.match(sb.id, /^sb-[0-9a-f]{32}$/);
      assert.ok((await c.sandboxes.list()).some((x) => x.id === id));
      let r = await sb.exec("echo hi; echo err >&2; exit 3");
      assert.deepEqual([r.stdout, r.stderr, r.exit_code], ["hi\n", "err\n", 3]);
      assert.equal((await sb.exec(["printf", "%s", "a b"])).stdout, "a b");
      const kinds = [];
      for await (const ev of sb.execStream("echo x")) kinds.push(ev.event);
      assert.deepEqual([kinds[0], kinds.at(-1)], ["start", "exit"]);

      const p = await sb.spawn("cat; echo end", { stdin: true });
      assert.ok((await sb.processes()).some((x) => x.pid === p.pid));
      await p.write("one\n");
      await p.write(new Uint8Array([116, 119, 111, 10]), true);
      r = await p.wait();
      assert.deepEqual([r.stdout, r.exit_code], ["one\ntwo\nend\n", 0]);
      const slow = await sb.spawn(["sleep", "600"]);
      await slow.signal("SIGKILL");
      assert.equal((await slow.wait()).signal, "SIGKILL");

      await sb.files.write("d/in.bin", new Uint8Array([0, 255, 100]));
      assert.deepEqual([...(await sb.files.read("d/in.bin"))], [0, 255, 100]);
      await sb.exec("echo made > out.txt");
      assert.equal((await sb.files.read("out.txt")).toString(), "made\n");
      assert.deepEqual((await sb.files.list()).map((f) => f.name).sort(), ["d", "out.txt"]);
      assert.deepEqual((await sb.files.list("d")).map((f) => f.name), ["in.bin"]);
      await sb.files.remove("out.txt");
      await refused(404, () => sb.files.read("out.txt"));

      const before = sb.info.expires_at;
      assert.notEqual((await sb.setTimeout(90)).expires_at, before);
      assert.ok(sb.portUrl(3000).endsWith(`/v1/sandboxes/${sb.id}/ports/3000/`), sb.portUrl(3000));
      assert.equal((await c.sandboxes.get(sb.id)).id, sb.id);
    } finally {
      await sb[Symbol.asyncDispose]();
    }
    assert.ok(!(await c.sandboxes.list()).some((x) => x.id === id));
    await refused(404, () => c.sandboxes.get(id));
  });

  test("wrong token", { skip: !TOKEN && "no token on this server" }, async () => {
    const bad = new Client(ADDRESS, { token: "wrong" });
    await refused(401, () => bad.health());
    await refused(401, () => bad.run({ code: "print(1)" }));
  });
});
