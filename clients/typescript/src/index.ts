/**
 * The client of agentrun serve's HTTP API (internal/server/openapi.json).
 *
 * Node's own modules only; Node 18 or later. Every call is bounded by a
 * timeout; a refusal throws AgentrunError with the server's status, the
 * task field at fault and, for 429 and 503, when to try again. Nothing is
 * retried unless the client is asked to (`retries`).
 *
 * @module
 */

import * as http from "node:http";
import * as https from "node:https";
import type { components } from "./openapi.js";
import { TASK_PROPERTIES } from "./task.js";

type Schemas = components["schemas"];

/** task.json, as the server reads it. */
export type Task = Schemas["Task"];
/** The outcome of one run. */
export type Result = Schemas["Result"];
/** One line of a streamed run. */
export type Event = Schemas["Event"];
/**
 * A request to a service, or a tool call (`kind` "tool"), held for a
 * decision. A request has `method`, `url` and `body_excerpt`; a tool call
 * has `service` the tool server, `tool` and `arguments` (JSON, whole), and
 * the request's fields empty. The program's words come escaped: show them
 * as they are, as the program's.
 */
export type HeldRequest = Schemas["HeldRequest"];
/** GET /healthz. */
export type Health = Schemas["Health"];
/** A kept session and its files. */
export type SessionInfo = Schemas["SessionInfo"];
/** One file of a kept session. */
export type SessionFile = Schemas["SessionFile"];
/** The answer of a fork: the new sessions, in order, and how their files were copied. */
export type ForkAnswer = Schemas["ForkAnswer"];
/** An input file as task.json spells it. */
export type TaskFile = Schemas["TaskFile"];
/** A stateful run's report on the state it left: kept, dropped, bytes, saved, reason. */
export type State = Schemas["State"];
/** The body of POST /v1/sandboxes: a task's fields but its program, and its lifetime. */
export type SandboxRequest = Schemas["SandboxRequest"];
/** A live sandbox as serve shows it: id, expires_at, image, created. */
export type SandboxInfo = Schemas["Sandbox"];
/** One event of a live sandbox's process: start, stdout, stderr, exit. */
export type ProcessEvent = Schemas["ProcessEvent"];
/** A live sandbox's process as a list shows it. */
export type ProcessInfo = Schemas["ProcessInfo"];
/** One entry of a live sandbox's directory. */
export type SandboxFile = Schemas["SandboxFile"];

/** A process to run in a live sandbox: a shell line, or an argv. */
export interface ProcessOptions {
  /** Its working directory: absolute, or relative to /workspace (the default). */
  cwd?: string;
  env?: Record<string, string>;
  /** Kill it after so long ("30s", or seconds). */
  timeout?: string | number;
}

/** The outcome of a live sandbox's process (Sandbox.exec, SandboxProcess.wait). */
export interface ProcessResult {
  pid?: number;
  stdout: string;
  stderr: string;
  exit_code?: number;
  signal?: string;
  timed_out: boolean;
  duration_ms?: number;
  dropped_bytes: number;
}

/** The address a client uses when given none and $AGENTRUN_SERVER is unset. */
export const DEFAULT_ADDRESS = "unix:///run/agentrun/agentrun.sock";

// Bounds on what is read from the server: a result (collected files
// included, base64) and one line of a stream.
const MAX_ANSWER = 256 << 20;
const MAX_LINE = 64 << 20;
// The longest Retry-After (seconds) a retry waits.
const MAX_RETRY_WAIT = 30;

// What a RunTask may name: task.json's fields, and timeout.
const TASK_FIELDS = new Set<string>([...TASK_PROPERTIES, "timeout"]);

/**
 * A task for {@link Client.run} and {@link Client.stream}: task.json's
 * fields, with two conveniences. A `files` value may be text (a string),
 * bytes (a Uint8Array, sent as base64) or task.json's own `{content}` or
 * `{content_base64}`; `timeout` is `limits.timeout` ("5s", or seconds as a
 * number).
 */
export type RunTask = Omit<Task, "files"> & {
  files?: Record<string, string | Uint8Array | TaskFile> | null;
  timeout?: string | number;
};

/**
 * A refusal or failure of a call.
 *
 * `status`: the HTTP status (undefined when no answer came: see
 * {@link TransportError}); `field`: the task field at fault, as task.json
 * spells it ("limits.memory", "image", "session"); `retryAfter`: seconds
 * after which to try again (429, 503); `result`: the run's result when the
 * server sent one (a run agentrun could not run: status 500, its `error`
 * says why).
 */
export class AgentrunError extends Error {
  readonly status?: number;
  readonly field?: string;
  readonly retryAfter?: number;
  readonly result?: Result;

  constructor(message: string, init: { status?: number; field?: string; retryAfter?: number; result?: Result } = {}) {
    super(message);
    this.name = "AgentrunError";
    this.status = init.status;
    this.field = init.field;
    this.retryAfter = init.retryAfter;
    this.result = init.result;
  }

  override toString(): string {
    const parts: string[] = [];
    if (this.status !== undefined) parts.push(String(this.status));
    if (this.field) parts.push(this.field + ":");
    parts.push(this.message);
    return `${this.name}: ${parts.join(" ")}`;
  }
}

/**
 * No whole answer: the server could not be reached, did not answer within
 * the timeout, or cut its answer (a stream without its result).
 */
export class TransportError extends AgentrunError {
  constructor(message: string) {
    super(message);
    this.name = "TransportError";
  }
}

/** Options of a {@link Client}. */
export interface ClientOptions {
  /** The server's bearer token; by default $AGENTRUN_TOKEN. */
  token?: string;
  /** Milliseconds an ordinary call may take, answer included (30 000). */
  timeoutMs?: number;
  /** Milliseconds a run may take to answer, and a stream to end (600 000). */
  runTimeoutMs?: number;
  /**
   * Times a run refused with 429 or 503 is sent again, after the server's
   * Retry-After (at most 30 s); 0, the default: never. Both refusals come
   * before a run starts, so a retry never runs a task twice.
   */
  retries?: number;
}

/** Options of one {@link Client.stream}. */
export interface StreamOptions {
  /**
   * Decides each request (or tool call, `kind` "tool") held for approval
   * as it comes: true approves it, false denies it, undefined or null
   * leaves it to another channel (the webhook, the approvals page,
   * {@link Client.approve}) or its timeout.
   */
  onApproval?: (request: HeldRequest & { run: string }) => boolean | null | undefined | Promise<boolean | null | undefined>;
  /** Milliseconds the whole stream may take; by default the client's runTimeoutMs. */
  timeoutMs?: number;
}

/** An answer: its status, headers and body, unread. */
interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: http.IncomingMessage;
  /** Ends the call: its timer and its connection. */
  close(): void;
}

/** A client of agentrun serve. */
export class Client {
  readonly address: string;
  readonly sessions: Sessions;
  readonly sandboxes: Sandboxes;
  /** Milliseconds an ordinary call may take. */
  readonly timeoutMs: number;
  private readonly token?: string;
  private readonly runTimeoutMs: number;
  private readonly retries: number;
  private readonly socketPath?: string;
  private readonly url?: URL;

  /**
   * @param address "unix:///path/to.sock", "http://host:port" or
   * "https://..."; by default $AGENTRUN_SERVER, else
   * unix:///run/agentrun/agentrun.sock.
   */
  constructor(address?: string, options: ClientOptions = {}) {
    address = address || process.env.AGENTRUN_SERVER || DEFAULT_ADDRESS;
    this.address = address;
    this.token = options.token ?? (process.env.AGENTRUN_TOKEN || undefined);
    this.timeoutMs = positive("timeoutMs", options.timeoutMs ?? 30_000);
    this.runTimeoutMs = positive("runTimeoutMs", options.runTimeoutMs ?? 600_000);
    this.retries = options.retries ?? 0;
    if (!Number.isInteger(this.retries) || this.retries < 0) {
      throw new TypeError(`retries ${options.retries}: want a whole number, 0 or more`);
    }
    let u: URL;
    try {
      u = new URL(address);
    } catch {
      throw new TypeError(`address ${JSON.stringify(address)}: want unix:///path, http://host:port or https://host:port`);
    }
    if (u.protocol === "unix:") {
      this.socketPath = decodeURIComponent(u.pathname) || u.host;
      if (!this.socketPath) throw new TypeError(`address ${JSON.stringify(address)}: no socket path`);
    } else if (u.protocol === "http:" || u.protocol === "https:") {
      this.url = u;
    } else {
      throw new TypeError(`address ${JSON.stringify(address)}: want unix:///path, http://host:port or https://host:port`);
    }
    this.sessions = new Sessions(this);
    this.sandboxes = new Sandboxes(this);
  }

  // --- runs ---

  /**
   * Runs a task and returns its result: stdout, stderr, exit_code,
   * timed_out, ... The program's own failure is a result; a task the
   * server refuses, or one agentrun could not run (status 500, with
   * `result`), throws AgentrunError.
   */
  async run(task: RunTask, options: { timeoutMs?: number } = {}): Promise<Result> {
    const body = Buffer.from(JSON.stringify(toTask(task)));
    const { status, headers, data } = await this.call("POST", "/v1/runs", body, "application/json",
      options.timeoutMs ?? this.runTimeoutMs, true);
    const res = parseJSON(status, data);
    if (status === 200) return res as Result;
    throw refusal(status, headers, res);
  }

  /**
   * Runs a task and yields its events as they come: `stdout` and `stderr`
   * with `data`, `approval` with `run` and `approval` (a request held for
   * a decision, given to `onApproval`), and last `result`. A stream cut
   * before its result throws TransportError; a run agentrun could not run
   * throws AgentrunError (status 500, with `result`). Leaving the loop
   * early closes the connection.
   */
  async *stream(task: RunTask, options: StreamOptions = {}): AsyncGenerator<Event, void, undefined> {
    const body = Buffer.from(JSON.stringify(toTask(task)));
    const limit = options.timeoutMs ?? this.runTimeoutMs;
    const ans = await this.open("POST", "/v1/runs?stream=1", body, "application/json", limit, true);
    try {
      if (ans.status !== 200) {
        const data = await readAll(ans.body);
        throw refusal(ans.status, ans.headers, parseJSON(ans.status, data));
      }
      for await (const line of lines(ans.body)) {
        const ev = parseLine(line) as Event;
        if (ev.event === "approval" && options.onApproval && ev.approval && ev.run) {
          const ok = await options.onApproval({ ...ev.approval, run: ev.run });
          if (ok !== undefined && ok !== null) {
            try {
              await this.approve(ev.run, ev.approval.id, Boolean(ok));
            } catch (e) {
              // Too late: it timed out or its request ended, as the
              // result's network.approvals will say.
              if (!(e instanceof AgentrunError) || e.status !== 404) throw e;
            }
          }
        }
        if (ev.event === "result") {
          if (ev.result?.error) {
            throw new AgentrunError(ev.result.error, { status: 500, result: ev.result });
          }
          yield ev;
          return;
        }
        yield ev;
      }
      throw new TransportError("stream ended before the result");
    } finally {
      ans.close();
    }
  }

  /**
   * Decides a request of run held for approval (the approval event's `run`
   * and `approval.id`); `by`, at most 64 bytes, names who decided in the
   * result and the audit record ("operator (serve API: BY)").
   */
  async approve(run: string, approvalId: string, approve: boolean, by?: string): Promise<Schemas["DecisionTaken"]> {
    const decision: Schemas["Decision"] = { approve };
    if (by !== undefined) decision.by = by;
    return (await this.jsonCall("POST", `/v1/runs/${quote(run)}/approvals/${quote(approvalId)}`,
      Buffer.from(JSON.stringify(decision)), "application/json")) as Schemas["DecisionTaken"];
  }

  /**
   * A notebook-like context: a kept session whose Python globals carry
   * from one run to the next (keep_state), each run still a fresh
   * sandbox. Without sessionId it makes a session; close() removes the
   * session, and `await using` removes it at the end of its block when
   * the context made it. `options.tools` names the config's tool servers
   * every run of the context may call (task.json's `tools`), unless a run
   * names its own.
   */
  async context(sessionId?: string, options: { tools?: string[] } = {}): Promise<Context> {
    if (sessionId !== undefined) return new Context(this, sessionId, false, options.tools);
    return new Context(this, await this.sessions.create(), true, options.tools);
  }

  // --- the server ---

  /** GET /healthz: runs going on and waiting, and the warm pool. */
  async health(): Promise<Health> {
    return (await this.jsonCall("GET", "/healthz")) as Health;
  }

  /** The OpenAPI document of the server's API. */
  async openapi(): Promise<Record<string, unknown>> {
    return (await this.jsonCall("GET", "/v1/openapi.json")) as Record<string, unknown>;
  }

  // --- plumbing ---

  /** @internal A call whose answer is JSON (or nothing, 204). */
  async jsonCall(method: string, path: string, body?: Buffer, ctype?: string): Promise<unknown> {
    const { status, headers, data } = await this.call(method, path, body, ctype, this.timeoutMs);
    if (status === 204) return undefined;
    const res = parseJSON(status, data);
    if (status === 200 || status === 201) return res;
    throw refusal(status, headers, res);
  }

  /** @internal Sends a request and reads its whole answer. */
  async call(method: string, path: string, body: Buffer | undefined, ctype: string | undefined, timeoutMs: number,
    retry = false): Promise<{ status: number; headers: http.IncomingHttpHeaders; data: Buffer }> {
    const ans = await this.open(method, path, body, ctype, timeoutMs, retry);
    try {
      return { status: ans.status, headers: ans.headers, data: await readAll(ans.body) };
    } finally {
      ans.close();
    }
  }

  /** @internal The events of a process's NDJSON answer (POST …/processes, GET …/events), until its exit. */
  async *events(method: string, path: string, body: Buffer | undefined, timeoutMs?: number): AsyncGenerator<ProcessEvent, void, undefined> {
    const ans = await this.open(method, path, body, body ? "application/json" : undefined, timeoutMs ?? this.runTimeoutMs, false);
    try {
      if (ans.status !== 200) {
        const data = await readAll(ans.body);
        throw refusal(ans.status, ans.headers, parseJSON(ans.status, data));
      }
      for await (const line of lines(ans.body)) {
        const ev = parseLine(line) as ProcessEvent;
        yield ev;
        if (ev.event === "exit") return;
      }
      throw new TransportError("the process's stream ended before its exit");
    } finally {
      ans.close();
    }
  }

  /** @internal The base of the URLs of the server, "" on a unix socket. */
  base(): string {
    return this.url ? this.url.origin + this.url.pathname.replace(/\/+$/, "") : "";
  }

  /** Sends a request, retrying a 429 or 503 when asked; the answer's body is unread. */
  private async open(method: string, path: string, body: Buffer | undefined, ctype: string | undefined,
    timeoutMs: number, retry: boolean): Promise<Answer> {
    for (let attempt = 0; ; attempt++) {
      const ans = await this.send(method, path, body, ctype, timeoutMs);
      const wait = retryAfter(ans.headers);
      if (retry && attempt < this.retries && (ans.status === 429 || ans.status === 503) &&
        wait !== undefined && wait <= MAX_RETRY_WAIT) {
        ans.close();
        await new Promise((r) => setTimeout(r, wait * 1000));
        continue;
      }
      return ans;
    }
  }

  /** One request on a connection of its own, ended at timeoutMs whatever it is doing. */
  private send(method: string, path: string, body: Buffer | undefined, ctype: string | undefined,
    timeoutMs: number): Promise<Answer> {
    const headers: Record<string, string> = { Accept: "application/json" };
    if (this.token) headers.Authorization = "Bearer " + this.token;
    if (ctype) headers["Content-Type"] = ctype;
    if (body) headers["Content-Length"] = String(body.length);
    let opts: http.RequestOptions;
    let mod: typeof http | typeof https = http;
    if (this.socketPath !== undefined) {
      headers.Host = "agentrun";
      opts = { socketPath: this.socketPath, path, method, headers, agent: false };
    } else {
      const u = this.url!;
      mod = u.protocol === "https:" ? https : http;
      opts = {
        protocol: u.protocol, hostname: u.hostname.replace(/^\[|\]$/g, ""), port: u.port || undefined,
        path: u.pathname.replace(/\/+$/, "") + path, method, headers, agent: false,
      };
    }
    const what = `${method} ${path} on ${this.address}`;
    return new Promise<Answer>((resolve, reject) => {
      let res: http.IncomingMessage | undefined;
      const req = mod.request(opts);
      const timer = setTimeout(() => {
        const err = new TransportError(`${what}: no whole answer within ${timeoutMs / 1000} s`);
        if (res) res.destroy(err);
        req.destroy(err);
      }, timeoutMs);
      const close = () => {
        clearTimeout(timer);
        req.destroy();
        res?.destroy();
      };
      req.on("error", (e) => {
        close();
        reject(e instanceof TransportError ? e : new TransportError(`${what}: ${why(e)}`));
      });
      req.on("response", (r) => {
        res = r;
        resolve({ status: r.statusCode ?? 0, headers: r.headers, body: r, close });
      });
      req.end(body);
    });
  }
}

/**
 * Kept sessions: a /workspace that outlives a run ({@link Client.sessions}).
 * A run uses one with `session: id, keep_workspace: true`.
 */
export class Sessions {
  constructor(private readonly c: Client) {}

  /** Makes a session and returns its id (a capability: keep it). */
  async create(): Promise<string> {
    return ((await this.c.jsonCall("POST", "/v1/sessions")) as Schemas["NewSession"]).id;
  }

  /** The session (created, last_used, max_bytes, busy, ...) and its files. */
  async get(id: string): Promise<SessionInfo> {
    return (await this.c.jsonCall("GET", "/v1/sessions/" + quote(id))) as SessionInfo;
  }

  /** The session's files: name (workspace-relative), type, size, mtime. */
  async files(id: string): Promise<SessionFile[]> {
    return (await this.get(id)).files ?? [];
  }

  /** The bytes of the session's file path (relative to /workspace). */
  async read(id: string, path: string): Promise<Buffer> {
    const { status, headers, data } = await this.c.call("GET", filePath(id, path), undefined, undefined,
      this.c.timeoutMs);
    if (status === 200) return data;
    throw refusal(status, headers, parseJSON(status, data));
  }

  /** Writes data (bytes, or a string as UTF-8) as the session's file path. */
  async write(id: string, path: string, data: string | Uint8Array): Promise<void> {
    const body = typeof data === "string" ? Buffer.from(data, "utf8") : Buffer.from(data);
    await this.c.jsonCall("PUT", filePath(id, path), body, "application/octet-stream");
  }

  /** Removes the session and its files. */
  async delete(id: string): Promise<void> {
    await this.c.jsonCall("DELETE", "/v1/sessions/" + quote(id));
  }

  /**
   * Makes count new sessions (1 to 64), each a copy of the session's files,
   * independent from then on; the answer lists them in order and says how
   * the files were copied ("reflink" or "copy").
   */
  async fork(id: string, count: number): Promise<ForkAnswer & { sessions: Schemas["ForkedSession"][] }> {
    const res = (await this.c.jsonCall("POST", `/v1/sessions/${quote(id)}/fork`,
      Buffer.from(JSON.stringify({ count })), "application/json")) as ForkAnswer;
    return { ...res, sessions: res.sessions ?? [] };
  }
}

/**
 * Live sandboxes ({@link Client.sandboxes}, docs/sandboxes.md): a sandbox
 * whose processes outlive the call that started them, until it ends (its
 * timeout, close(), or serve stopping).
 */
export class Sandboxes {
  constructor(private readonly c: Client) {}

  /**
   * Makes a live sandbox: a task's fields but its program, and `timeout`
   * its lifetime ("10m", or seconds). `await using sb = await
   * c.sandboxes.create()` ends it at the end of the block.
   */
  async create(req: Omit<SandboxRequest, "timeout"> & { timeout?: string | number } = {}): Promise<Sandbox> {
    const body: SandboxRequest = { ...req, timeout: duration(req.timeout) } as SandboxRequest;
    const info = (await this.c.jsonCall("POST", "/v1/sandboxes", Buffer.from(JSON.stringify(body)),
      "application/json")) as SandboxInfo;
    return new Sandbox(this.c, info);
  }

  /** The live sandbox id (a capability), as a Sandbox. */
  async get(id: string): Promise<Sandbox> {
    return new Sandbox(this.c, (await this.c.jsonCall("GET", "/v1/sandboxes/" + quote(id))) as SandboxInfo);
  }

  /** The live sandboxes. */
  async list(): Promise<SandboxInfo[]> {
    return ((await this.c.jsonCall("GET", "/v1/sandboxes")) as { sandboxes: SandboxInfo[] | null }).sandboxes ?? [];
  }
}

/**
 * A live sandbox: its processes (exec, spawn), files and ports. close()
 * (or the end of an `await using` block) ends it, killing everything in
 * it.
 */
export class Sandbox {
  readonly id: string;
  readonly files: SandboxFiles;
  /** The sandbox as serve last showed it. */
  info: SandboxInfo;

  /** @internal */
  constructor(readonly client: Client, info: SandboxInfo) {
    this.info = info;
    this.id = info.id;
    this.files = new SandboxFiles(this);
  }

  /** @internal */
  path(rest = ""): string {
    return "/v1/sandboxes/" + quote(this.id) + rest;
  }

  /** The sandbox as serve has it now (expires_at, ...); also kept as `info`. */
  async get(): Promise<SandboxInfo> {
    this.info = (await this.client.jsonCall("GET", this.path())) as SandboxInfo;
    return this.info;
  }

  /**
   * Runs cmd (a shell line, or an argv) to its end: stdout, stderr,
   * exit_code, signal, timed_out, duration_ms, dropped_bytes, pid.
   */
  async exec(cmd: string | string[], options: ProcessOptions & { timeoutMs?: number } = {}): Promise<ProcessResult> {
    return outcome(this.execStream(cmd, options));
  }

  /** Runs cmd and yields its events as they come: start, stdout, stderr, and last exit. */
  execStream(cmd: string | string[], options: ProcessOptions & { timeoutMs?: number } = {}): AsyncGenerator<ProcessEvent, void, undefined> {
    return this.client.events("POST", this.path("/processes"), processRequest(cmd, options, false), options.timeoutMs);
  }

  /** Starts cmd in the background; `stdin: true` keeps its stdin open for write(). */
  async spawn(cmd: string | string[], options: ProcessOptions & { stdin?: boolean } = {}): Promise<SandboxProcess> {
    const res = (await this.client.jsonCall("POST", this.path("/processes?wait=false"),
      processRequest(cmd, options, options.stdin ?? false), "application/json")) as Schemas["ProcessStarted"];
    return new SandboxProcess(this, res.pid);
  }

  /** The SandboxProcess of a process already started (its pid inside). */
  process(pid: number): SandboxProcess {
    return new SandboxProcess(this, pid);
  }

  /** Its processes, running and recently ended. */
  async processes(): Promise<ProcessInfo[]> {
    return ((await this.client.jsonCall("GET", this.path("/processes"))) as { processes: ProcessInfo[] | null }).processes ?? [];
  }

  /** Makes it end timeout ("10m", or seconds) from now, within its max lifetime. */
  async setTimeout(timeout: string | number): Promise<SandboxInfo> {
    this.info = (await this.client.jsonCall("POST", this.path("/timeout"),
      Buffer.from(JSON.stringify({ timeout: duration(timeout) })), "application/json")) as SandboxInfo;
    return this.info;
  }

  /**
   * The URL through serve of TCP port inside it (HTTP and WebSocket),
   * /v1/sandboxes/ID/ports/PORT/: with the API's token, or the sandbox's
   * preview_token. On a unix socket, the path alone.
   */
  portUrl(port: number): string {
    if (!Number.isInteger(port) || port < 1 || port > 65535) throw new TypeError(`port ${port}: want 1 to 65535`);
    return this.client.base() + this.path(`/ports/${port}/`);
  }

  /** Ends it: every process killed, everything torn down. One that had ended already is no error. */
  async close(): Promise<void> {
    try {
      await this.client.jsonCall("DELETE", this.path());
    } catch (e) {
      if (!(e instanceof AgentrunError) || e.status !== 404) throw e;
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/** A process of a live sandbox ({@link Sandbox.spawn}, {@link Sandbox.process}). */
export class SandboxProcess {
  constructor(readonly sandbox: Sandbox, readonly pid: number) {}

  private path(rest: string): string {
    return this.sandbox.path(`/processes/${this.pid}${rest}`);
  }

  /** Writes data (a string, or bytes) to its stdin, at most 1 MiB a call; `close` closes it after. */
  async write(data: string | Uint8Array, close = false): Promise<void> {
    const req: Schemas["StdinRequest"] = { close };
    if (typeof data === "string") req.data = data;
    else req.data_b64 = Buffer.from(data).toString("base64");
    await this.sandbox.client.jsonCall("POST", this.path("/stdin"), Buffer.from(JSON.stringify(req)), "application/json");
  }

  /** Closes its stdin: the end of its input. */
  async closeStdin(): Promise<void> {
    await this.write("", true);
  }

  /** Sends it signal ("SIGINT", "TERM", ...). */
  async signal(signal = "SIGTERM"): Promise<void> {
    await this.sandbox.client.jsonCall("POST", this.path("/signal"), Buffer.from(JSON.stringify({ signal })), "application/json");
  }

  /** Attaches: the kept tail of its events, then those to come, until its exit. */
  events(options: { timeoutMs?: number } = {}): AsyncGenerator<ProcessEvent, void, undefined> {
    return this.sandbox.client.events("GET", this.path("/events"), undefined, options.timeoutMs);
  }

  /** Waits for its end: its result as {@link Sandbox.exec} gives it (output as far as the sandbox kept it). */
  async wait(options: { timeoutMs?: number } = {}): Promise<ProcessResult> {
    return outcome(this.events(options));
  }
}

/** The files of a live sandbox's /workspace: names relative to it, or absolute in it; never through a link. */
export class SandboxFiles {
  constructor(private readonly sb: Sandbox) {}

  private path(name: string, query = ""): string {
    return this.sb.path("/files/" + quote(name) + query);
  }

  /** The bytes of the file, at most 16 MiB. */
  async read(path: string): Promise<Buffer> {
    const c = this.sb.client;
    const { status, headers, data } = await c.call("GET", this.path(path), undefined, undefined, c.timeoutMs);
    if (status === 200) return data;
    throw refusal(status, headers, parseJSON(status, data));
  }

  /** Writes data (bytes, or a string as UTF-8) as the file, at most 16 MiB. */
  async write(path: string, data: string | Uint8Array): Promise<void> {
    const body = typeof data === "string" ? Buffer.from(data, "utf8") : Buffer.from(data);
    await this.sb.client.jsonCall("PUT", this.path(path), body, "application/octet-stream");
  }

  /** The directory's entries (/workspace's by default). */
  async list(path = ""): Promise<SandboxFile[]> {
    return ((await this.sb.client.jsonCall("GET", this.path(path, "?list=1"))) as SandboxFile[] | null) ?? [];
  }

  /** Removes the file (or empty directory). */
  async remove(path: string): Promise<void> {
    await this.sb.client.jsonCall("DELETE", this.path(path));
  }
}

/** A duration as the API takes it: "10m", or seconds as a number. */
function duration(v: string | number | undefined): string | undefined {
  return typeof v === "number" ? `${v}s` : v;
}

/** The body of POST …/processes. */
function processRequest(cmd: string | string[], o: ProcessOptions, stdin: boolean): Buffer {
  const req: Schemas["ProcessRequest"] = typeof cmd === "string" ? { cmd } : { command: [...cmd] };
  if (o.cwd !== undefined) req.cwd = o.cwd;
  if (o.env) req.env = { ...o.env };
  if (stdin) req.stdin = true;
  if (o.timeout !== undefined) req.timeout = duration(o.timeout);
  return Buffer.from(JSON.stringify(req));
}

/** The bytes of a process's stdout, stderr or pty event (data, or data_b64 for bytes that are not UTF-8). */
export function eventBytes(ev: ProcessEvent): Buffer {
  return ev.data_b64 ? Buffer.from(ev.data_b64, "base64") : Buffer.from(ev.data ?? "", "utf8");
}

/** A process's result from its events; bytes that are not UTF-8 replaced. */
async function outcome(events: AsyncIterable<ProcessEvent>): Promise<ProcessResult> {
  const out: Record<"stdout" | "stderr", Buffer[]> = { stdout: [], stderr: [] };
  let pid: number | undefined;
  for await (const ev of events) {
    if (ev.event === "start") pid = ev.pid;
    else if (ev.event === "stdout" || ev.event === "stderr") {
      out[ev.event].push(eventBytes(ev));
    } else if (ev.event === "exit") {
      return {
        pid, stdout: Buffer.concat(out.stdout).toString("utf8"), stderr: Buffer.concat(out.stderr).toString("utf8"),
        exit_code: ev.exit_code, signal: ev.signal || undefined, timed_out: ev.timed_out ?? false,
        duration_ms: ev.duration_ms, dropped_bytes: ev.dropped_bytes ?? 0,
      };
    }
  }
  throw new TransportError("the process's stream ended before its exit");
}

/** A task of a {@link Context}: a RunTask without the fields the context sets. */
export type ContextTask = Omit<RunTask, "code" | "session" | "keep_state" | "reset_state">;

/**
 * State kept between runs of one kept session ({@link Client.context}):
 * each run starts with the globals the previous one left (values,
 * functions, classes, imports), in a fresh sandbox.
 *
 *     await using ctx = await c.context();
 *     await ctx.run("x = 1");
 *     (await ctx.run("x + 1")).value?.["text/plain"];   // "2"
 */
export class Context {
  /** The session's id (a capability). */
  readonly id: string;
  /** The tool servers every run may call unless it names its own. */
  readonly tools?: string[];
  private readonly c: Client;
  private readonly made: boolean;

  /** @internal Use {@link Client.context}. */
  constructor(client: Client, id: string, made: boolean, tools?: string[]) {
    this.c = client;
    this.id = id;
    this.made = made;
    if (tools?.length) this.tools = [...tools];
  }

  /**
   * Runs code (Python) with the context's state (and tools); the result
   * as {@link Client.run} gives it, its `state` saying what was kept.
   */
  run(code: string, task: ContextTask = {}, options: { timeoutMs?: number } = {}): Promise<Result> {
    return this.c.run({ ...this.withTools(task), code, session: this.id, keep_state: true }, options);
  }

  /** {@link Client.stream} of code with the context's state (and tools). */
  stream(code: string, task: ContextTask = {}, options: StreamOptions = {}): AsyncGenerator<Event, void, undefined> {
    return this.c.stream({ ...this.withTools(task), code, session: this.id, keep_state: true }, options);
  }

  /** task with the context's tools, unless it names its own. */
  private withTools(task: ContextTask): ContextTask {
    return this.tools && task.tools == null ? { ...task, tools: this.tools } : task;
  }

  /** Clears the state: the next run starts with no globals (the session's files stay). */
  async reset(): Promise<void> {
    await this.c.run({ code: "pass", session: this.id, reset_state: true });
  }

  /**
   * count new contexts (1 to 64), each a copy of this one's state and
   * files, independent from then on. Neither this one's close() nor the
   * end of a block removes them: close each.
   */
  async fork(count: number): Promise<Context[]> {
    const res = await this.c.sessions.fork(this.id, count);
    return res.sessions.map((s) => new Context(this.c, s.id, false));
  }

  /** Removes the session, its files and state. */
  async close(): Promise<void> {
    await this.c.sessions.delete(this.id);
  }

  /** The end of an `await using` block: close() when the context made the session. */
  async [Symbol.asyncDispose](): Promise<void> {
    if (this.made) await this.close();
  }
}

/** task.json from a RunTask; an unknown field is a TypeError before anything is sent. */
export function toTask(fields: RunTask): Task {
  const unknown = Object.keys(fields).filter((k) => !TASK_FIELDS.has(k)).sort();
  if (unknown.length) throw new TypeError(`unknown task field(s): ${unknown.join(", ")}`);
  const { timeout, files, ...rest } = fields;
  const task: Task = {};
  for (const [k, v] of Object.entries(rest)) {
    if (v !== undefined && v !== null) (task as Record<string, unknown>)[k] = v;
  }
  if (files) {
    const out: Record<string, TaskFile> = {};
    for (const [name, v] of Object.entries(files)) {
      if (typeof v === "string") out[name] = { content: v };
      else if (v instanceof Uint8Array) out[name] = { content_base64: Buffer.from(v).toString("base64") };
      else out[name] = v;
    }
    task.files = out;
  }
  if (timeout !== undefined && timeout !== null) {
    const t = typeof timeout === "number" ? `${timeout}s` : timeout;
    task.limits = { ...(task.limits ?? {}), timeout: t };
  }
  return task;
}

/**
 * A session file's name as one path segment: slashes and dots escaped, so
 * that no part of it is read as a dot segment before the server checks it.
 */
export function quote(segment: string): string {
  return encodeURIComponent(segment).replace(/[.!'()*]/g, (c) => "%" + c.charCodeAt(0).toString(16).toUpperCase());
}

function filePath(id: string, path: string): string {
  return `/v1/sessions/${quote(id)}/files/${quote(path)}`;
}

function positive(name: string, v: number): number {
  if (!(typeof v === "number" && v > 0 && Number.isFinite(v))) {
    throw new TypeError(`${name} ${v}: want a number of milliseconds above 0`);
  }
  return v;
}

/** The whole body, at most MAX_ANSWER bytes. */
async function readAll(body: http.IncomingMessage): Promise<Buffer> {
  const length = Number(body.headers["content-length"]);
  if (length > MAX_ANSWER) throw new TransportError(`answer of ${length} bytes, more than ${MAX_ANSWER}`);
  const chunks: Buffer[] = [];
  let n = 0;
  try {
    for await (const chunk of body) {
      n += (chunk as Buffer).length;
      if (n > MAX_ANSWER) throw new TransportError(`answer larger than ${MAX_ANSWER} bytes`);
      chunks.push(chunk as Buffer);
    }
  } catch (e) {
    throw e instanceof TransportError ? e : new TransportError(`answer cut: ${why(e)}`);
  }
  // Node ends a body cut short of its length or its last chunk with an
  // "aborted" error, above; complete is its own word for it.
  if (!body.complete) throw new TransportError("answer cut before its end");
  return Buffer.concat(chunks);
}

/** The lines of a stream, each at most MAX_LINE bytes and ended by "\n". */
async function* lines(body: http.IncomingMessage): AsyncGenerator<Buffer> {
  let held: Buffer[] = [];
  let heldLen = 0;
  try {
    for await (const c of body) {
      let chunk = c as Buffer;
      for (let i = chunk.indexOf(10); i >= 0; i = chunk.indexOf(10)) {
        held.push(chunk.subarray(0, i));
        const line = Buffer.concat(held);
        held = [];
        heldLen = 0;
        chunk = chunk.subarray(i + 1);
        if (line.length > MAX_LINE) throw new TransportError(`stream line of ${line.length} bytes, more than ${MAX_LINE}`);
        yield line;
      }
      if (chunk.length) {
        held.push(chunk);
        heldLen += chunk.length;
        if (heldLen > MAX_LINE) throw new TransportError(`stream line longer than ${MAX_LINE} bytes`);
      }
    }
  } catch (e) {
    throw e instanceof TransportError ? e : new TransportError(`stream cut before the result: ${why(e)}`);
  }
  if (heldLen) throw new TransportError(`stream cut before the result: a line of ${heldLen} bytes without its end`);
}

/** One line of a stream, as JSON. */
function parseLine(line: Buffer): unknown {
  try {
    return JSON.parse(line.toString("utf8"));
  } catch {
    throw new TransportError(`stream line is not JSON: ${JSON.stringify(line.subarray(0, 100).toString())}`);
  }
}

function parseJSON(status: number, data: Buffer): unknown {
  if (!data.length) return {};
  try {
    return JSON.parse(data.toString("utf8"));
  } catch {
    throw new AgentrunError(`answer is not JSON: ${JSON.stringify(data.subarray(0, 200).toString())}`, { status });
  }
}

/**
 * The AgentrunError of a refusal: the API's {"error", "field"}, or a
 * result with its error (500: agentrun could not run the task).
 */
function refusal(status: number, headers: http.IncomingHttpHeaders, body: unknown): AgentrunError {
  const b = (body && typeof body === "object" ? body : {}) as Record<string, unknown>;
  const wait = retryAfter(headers);
  if ("exit_code" in b && "id" in b) {
    return new AgentrunError(String(b.error || "run failed"), { status, retryAfter: wait, result: b as unknown as Result });
  }
  return new AgentrunError(typeof b.error === "string" && b.error ? b.error : `HTTP ${status}`, {
    status, field: typeof b.field === "string" && b.field ? b.field : undefined, retryAfter: wait,
  });
}

function retryAfter(headers: http.IncomingHttpHeaders): number | undefined {
  const v = headers["retry-after"];
  if (v === undefined) return undefined;
  const n = Number(v);
  return Number.isFinite(n) && String(v).trim() !== "" ? n : undefined;
}

function why(e: unknown): string {
  if (e instanceof Error) {
    const code = (e as NodeJS.ErrnoException).code;
    return code && !e.message.includes(code) ? `${code}: ${e.message}` : e.message || e.name;
  }
  return String(e);
}
