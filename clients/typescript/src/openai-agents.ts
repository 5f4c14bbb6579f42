/**
 * agentrun for the OpenAI Agents SDK (`@openai/agents`, a peer
 * dependency): runCodeTool, a function tool whose answer carries what a
 * notebook shows (the value, figures as images, the state kept);
 * shellTools, Codex's exec_command and write_stdin on a live sandbox; and
 * AgentrunSandboxClient, the SDK's sandbox client on live sandboxes, for
 * a SandboxAgent's own shell, write_stdin, apply_patch and exposed ports.
 *
 * @module
 */

import { readFile } from "node:fs/promises";
import {
  applyDiff, tool, type ApplyPatchOperation, type ApplyPatchResult, type Editor, type ToolOutputImage,
  type ToolOutputText,
} from "@openai/agents";
import {
  Manifest, SandboxExecTransportError, SandboxPathResolutionError, SandboxProviderError,
  SandboxUnsupportedFeatureError, SandboxWorkspaceReadNotFoundError, normalizeSandboxClientCreateArgs,
  type Entry, type ExecCommandArgs, type ListDirectoryArgs, type MaterializeEntryArgs, type ReadFileArgs,
  type SandboxClient, type SandboxClientCreateArgs, type SandboxClientOptions, type SandboxDirectoryEntry,
  type SandboxExecResult, type SandboxSession, type SandboxSessionState, type WorkspaceArchiveData,
  type ExposedPortEndpoint, type ViewImageArgs, type WriteStdinArgs,
} from "@openai/agents/sandbox";
import { AgentrunError, TransportError, type Client, type Result, type Sandbox, type SandboxRequest } from "./index.js";
import { LiveShell, type ShellResult } from "./liveshell.js";
import {
  EXEC_DESCRIPTION, EXEC_TOOL, STDIN_TOOL, Shell, shellInputSchemas, stdinDescription, type ShellOutput,
} from "./shell.js";
import {
  DEFAULT_NAME, answer, describe, runCodeAnswer, runCodeInputSchema, type RunCodeAnswer, type RunCodeOptions,
} from "./tool.js";

export type { RunCodeAnswer, RunCodeInput, RunCodeOptions, RunCodeOutput, Figure } from "./tool.js";
export { MAX_HTML, MAX_TEXT } from "./tool.js";
export { LiveShell, type ShellResult } from "./liveshell.js";
export type { ShellOutput } from "./shell.js";

/**
 * The tool's input. The SDK's strict schemas want every field present and
 * no open-ended objects: language and files are null when not given, and
 * files is a list of {name, content}.
 */
export const runCodeInput = runCodeInputSchema("strict");

/**
 * An Agents SDK function tool that runs the model's code with client.
 * Its answer is the text every adapter and MCP's run_code give (the
 * output, how the run ended, the value, the state kept, what was cut),
 * followed by the run's figures as the SDK's image outputs when it has
 * any. With `session` or `context` the calls share their state (§11). A
 * refusal is told to the model as its reason and field, never a stack.
 */
export function runCodeTool(client: Client, options: RunCodeOptions = {}) {
  return tool({
    name: options.name ?? DEFAULT_NAME,
    description: describe(options),
    parameters: runCodeInput,
    execute: async (input) => toolOutput(await runCodeAnswer(client, {
      code: input.code, language: input.language,
      files: input.files ? Object.fromEntries(input.files.map((f) => [f.name, f.content])) : null,
    }, options)),
  });
}

/**
 * A run's answer as the SDK's tool output: the text alone, or with
 * images that text first and each image after it in order (displays',
 * then the value's).
 */
export function runAnswer(r: Result): string | (ToolOutputText | ToolOutputImage)[] {
  return toolOutput(answer(r));
}

function toolOutput(a: RunCodeAnswer | ShellOutput): string | (ToolOutputText | ToolOutputImage)[] {
  const figures = "figures" in a ? a.figures : [];
  if (!figures.length) return a.text;
  return [
    { type: "text", text: a.text },
    ...figures.map((f): ToolOutputImage => ({ type: "image", image: { data: f.data, mediaType: f.mimeType } })),
  ];
}

// --- a shell ---

const strict = shellInputSchemas("strict");
/** exec_command's input, strict: every field present, null when not given. */
export const execCommandInput = strict.exec;
/** write_stdin's input, strict. */
export const writeStdinInput = strict.stdin;

/**
 * Codex's pair of shell tools on a live sandbox, for an Agents SDK agent
 * (a plain Agent's tools), as the other adapters and MCP's door give
 * them: exec_command runs a command line and answers its output and
 * exit code when it ended within the yield time, else what it printed so
 * far and its process; write_stdin writes to a running process (or only
 * reads) and answers the same way. The caller ends the sandbox
 * (`await using sb = await c.sandboxes.create()`); `tty` runs each
 * command on a terminal.
 */
export function shellTools(sandbox: Sandbox, options: { tty?: boolean | { rows: number; cols: number } } = {}) {
  const shell = new Shell(sandbox.client, { sandbox, tty: options.tty });
  return [
    tool({
      name: EXEC_TOOL,
      description: EXEC_DESCRIPTION,
      parameters: execCommandInput,
      execute: async (input) => toolOutput(await shell.exec(input)),
    }),
    tool({
      name: STDIN_TOOL,
      description: stdinDescription(Boolean(options.tty)),
      parameters: writeStdinInput,
      execute: async (input) => toolOutput(await shell.writeStdin(input)),
    }),
  ];
}

// --- the SDK's sandbox client ---

/** The options of every sandbox an {@link AgentrunSandboxClient} makes. */
export interface AgentrunSandboxClientOptions extends SandboxClientOptions {
  /** The live sandbox's request: image, limits, network, env, runtime, and timeout (its lifetime). */
  sandbox?: Omit<SandboxRequest, "timeout"> & { timeout?: string | number };
  /**
   * serve's `server.preview_domain`, when set: exposed ports are then
   * reached by name (`PORT-ID.DOMAIN`) instead of by path.
   */
  previewDomain?: string;
}

/** A sandbox session's state: the manifest and the live sandbox it runs in. */
export interface AgentrunSandboxSessionState extends SandboxSessionState {
  /** The live sandbox's id, "sb-...": a capability. */
  sandboxId: string;
  environment: Record<string, string>;
}

const WORKSPACE = "/workspace";
const ARCHIVE = ".agentrun-workspace.tar";
/** The largest image viewImage gives, as the SDK's own sandboxes do. */
const MAX_IMAGE = 10 << 20;

/**
 * The Agents SDK's SandboxClient on agentrun serve's live sandboxes:
 * create makes one (every guarantee of a run's sandbox, its processes
 * outliving a call) and writes the manifest's files into its
 * /workspace, resume takes one up again by its id, delete ends it.
 */
export class AgentrunSandboxClient implements SandboxClient<AgentrunSandboxClientOptions, AgentrunSandboxSessionState> {
  readonly backendId = "agentrun";
  readonly supportsDefaultOptions = true;

  constructor(private readonly client: Client, private readonly options: AgentrunSandboxClientOptions = {}) {}

  async create(args?: SandboxClientCreateArgs<AgentrunSandboxClientOptions> | Manifest,
    manifestOptions?: AgentrunSandboxClientOptions): Promise<AgentrunSandboxSession> {
    const { manifest, options } = normalizeSandboxClientCreateArgs(args, manifestOptions);
    if (manifest.root !== WORKSPACE) {
      throw new SandboxUnsupportedFeatureError(`manifest root ${manifest.root}: agentrun's workspace is ${WORKSPACE}`,
        { root: manifest.root });
    }
    const opts = { ...this.options, ...(options ?? {}) };
    const environment = await manifest.resolveEnvironment();
    const sb = await provider(() => this.client.sandboxes.create(opts.sandbox ?? {}));
    const state: AgentrunSandboxSessionState = { manifest, sandboxId: sb.id, environment, workspaceReady: false };
    const session = new AgentrunSandboxSession(sb, state, opts);
    try {
      await session.applyManifest(manifest);
    } catch (e) {
      await sb.close().catch(() => {});
      throw e;
    }
    state.workspaceReady = true;
    return session;
  }

  async resume(state: AgentrunSandboxSessionState): Promise<AgentrunSandboxSession> {
    const sb = await provider(() => this.client.sandboxes.get(state.sandboxId));
    return new AgentrunSandboxSession(sb, state, this.options);
  }

  async delete(state: AgentrunSandboxSessionState): Promise<void> {
    await provider(async () => (await this.client.sandboxes.get(state.sandboxId)).close()).catch((e) => {
      if (!(e instanceof SandboxProviderError && e.details?.status === 404)) throw e;
    });
  }
}

/**
 * One sandbox session of the SDK: an agentrun live sandbox. A command
 * still running after its yield time goes on, with a session id for
 * writeStdin; a PTY is the sandbox's own terminal; files go through
 * serve's link-safe files API; ports through serve with the sandbox's
 * preview token.
 */
export class AgentrunSandboxSession implements SandboxSession<AgentrunSandboxSessionState> {
  private readonly shell: LiveShell;

  constructor(readonly sandbox: Sandbox, readonly state: AgentrunSandboxSessionState,
    private readonly options: AgentrunSandboxClientOptions = {}) {
    this.shell = new LiveShell(sandbox, state.environment ?? {});
  }

  supportsPty(): boolean {
    return true;
  }

  /**
   * Runs cmd with /bin/sh (or args.shell) -c, its stdin kept open, on a
   * terminal with args.tty: it answers when the command ends or
   * yieldTimeMs passes; one still running has a sessionId for writeStdin.
   */
  async exec(args: ExecCommandArgs): Promise<SandboxExecResult> {
    if (args.runAs) throw unsupported("running as another user", "runAs");
    const start = Date.now();
    const r = await this.execShell(() => this.shell.exec(args.cmd, {
      workdir: args.workdir ? this.absolute(args.workdir) : undefined, shell: args.shell, tty: args.tty,
      yieldMs: args.yieldTimeMs, maxOutputBytes: outputBytes(args.maxOutputTokens),
    }), args.cmd);
    return execResult(r, start);
  }

  async execCommand(args: ExecCommandArgs): Promise<string> {
    return formatExec(await this.exec(args));
  }

  /** Writes chars to a running command's stdin (Ctrl-C without a terminal: SIGINT) and answers with its new output. */
  async writeStdin(args: WriteStdinArgs): Promise<string> {
    const start = Date.now();
    try {
      const r = await this.shell.write(args.sessionId, args.chars ?? "", {
        yieldMs: args.yieldTimeMs, maxOutputBytes: outputBytes(args.maxOutputTokens),
      });
      return formatExec(execResult(r, start));
    } catch (e) {
      if (e instanceof AgentrunError && e.field === "process") {
        return formatExec({ output: `write_stdin failed: ${e.message}`, stdout: "", stderr: "", wallTimeSeconds: 0, exitCode: 1 });
      }
      throw providerError(e);
    }
  }

  /**
   * The endpoint of TCP port inside, through serve: serve's host and port,
   * `url` the whole URL (the port's path, with the preview token),
   * `query` the token. With the client's previewDomain, the host is
   * PORT-ID.DOMAIN and a URL built from host, port and query alone works.
   */
  async resolveExposedPort(port: number): Promise<ExposedPortEndpoint> {
    if (!Number.isInteger(port) || port < 1 || port > 65535) {
      throw new SandboxPathResolutionError(`port ${port}: want 1 to 65535`, { port });
    }
    const base = this.sandbox.client.base();
    if (!base) throw unsupported("exposed ports through a unix socket's client (give the client serve's http(s) address)", "exposedPorts", { port });
    const u = new URL(base);
    const token = this.sandbox.info.preview_token ?? (await provider(() => this.sandbox.get())).preview_token;
    if (!token) throw new SandboxProviderError("serve gave this sandbox no preview token", { port });
    const query = `preview_token=${encodeURIComponent(token)}`;
    const tls = u.protocol === "https:";
    const servePort = Number(u.port) || (tls ? 443 : 80);
    const domain = this.options.previewDomain;
    const endpoint: ExposedPortEndpoint = domain
      ? { host: `${port}-${this.sandbox.id}.${domain}`, port: servePort, tls, query }
      : { host: u.hostname.replace(/^\[|\]$/g, ""), port: servePort, tls, query };
    endpoint.url = domain
      ? `${u.protocol}//${endpoint.host}${u.port ? ":" + u.port : ""}/?${query}`
      : `${this.sandbox.portUrl(port)}?${query}`;
    (this.state.exposedPorts ??= {})[String(port)] = endpoint;
    return endpoint;
  }

  /** An editor for apply_patch: V4A diffs applied to files read and written through serve's files API. */
  createEditor(runAs?: string): Editor {
    if (runAs) throw unsupported("running as another user", "runAs");
    const done = (output: string): ApplyPatchResult => ({ status: "completed", output });
    return {
      createFile: async (op: Extract<ApplyPatchOperation, { type: "create_file" }>) => {
        const rel = this.relative(op.path);
        await provider(() => this.sandbox.files.write(rel, applyDiff("", op.diff, "create")));
        return done(`Created ${op.path}`);
      },
      updateFile: async (op: Extract<ApplyPatchOperation, { type: "update_file" }>) => {
        const rel = this.relative(op.path);
        const text = new TextDecoder().decode(await this.readFile({ path: op.path }));
        const next = applyDiff(text, op.diff);
        const to = op.moveTo ? this.relative(op.moveTo) : rel;
        await provider(() => this.sandbox.files.write(to, next));
        if (to !== rel) await provider(() => this.sandbox.files.remove(rel));
        return done(to !== rel ? `Updated ${op.path} and moved it to ${op.moveTo}` : `Updated ${op.path}`);
      },
      deleteFile: async (op: Extract<ApplyPatchOperation, { type: "delete_file" }>) => {
        const rel = this.relative(op.path);
        await provider(() => this.sandbox.files.remove(rel));
        return done(`Deleted ${op.path}`);
      },
    };
  }

  /** An image file of the workspace, at most 10 MiB, as the SDK's image output. */
  async viewImage(args: ViewImageArgs): Promise<ToolOutputImage> {
    const bytes = await this.readFile({ path: args.path, runAs: args.runAs });
    if (bytes.length > MAX_IMAGE) throw new SandboxProviderError(`Image file exceeds the 10 MB limit: ${args.path}`, { path: args.path });
    const mediaType = imageType(bytes);
    if (!mediaType) throw new SandboxProviderError(`${args.path}: not a supported image file (png, jpeg, gif, webp)`, { path: args.path });
    return { type: "image", image: { data: Buffer.from(bytes).toString("base64"), mediaType } };
  }

  /** The bytes of a file of the workspace. */
  async readFile(args: ReadFileArgs): Promise<Uint8Array> {
    if (args.runAs) throw unsupported("running as another user", "runAs");
    const rel = this.relative(args.path);
    try {
      const data = await this.sandbox.files.read(rel);
      const bytes = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
      return args.maxBytes !== undefined && bytes.length > args.maxBytes ? bytes.subarray(0, args.maxBytes) : bytes;
    } catch (e) {
      if (e instanceof AgentrunError && (e.status === 404 || e.status === 400)) {
        throw new SandboxWorkspaceReadNotFoundError(`${args.path}: ${e.message}`, { path: args.path });
      }
      throw providerError(e);
    }
  }

  /** The entries of a directory of the workspace, by workspace-relative path. */
  async listDir(args: ListDirectoryArgs): Promise<SandboxDirectoryEntry[]> {
    if (args.runAs) throw unsupported("running as another user", "runAs");
    const rel = this.relative(args.path);
    const entries = await this.list(rel);
    if (!entries) throw new SandboxWorkspaceReadNotFoundError(`${args.path}: no such directory`, { path: args.path });
    const prefix = rel ? rel + "/" : "";
    return entries.map((f) => ({
      name: f.name, path: prefix + f.name, type: f.type === "file" ? "file" : f.type === "dir" ? "dir" : "other",
    }));
  }

  async pathExists(path: string): Promise<boolean> {
    return (await this.entry(path)) !== undefined;
  }

  async directoryExists(path: string): Promise<boolean> {
    return (await this.entry(path)) === "dir";
  }

  /** Writes a manifest entry: a file, a local file, or a directory and its children. */
  async materializeEntry(args: MaterializeEntryArgs): Promise<void> {
    if (args.runAs) throw unsupported("running as another user", "runAs");
    const dirs: string[] = [];
    await this.materialize(this.relative(args.path), args.entry, dirs);
    await this.makeDirs(dirs);
  }

  async applyManifest(manifest: Manifest): Promise<void> {
    const dirs: string[] = [];
    for (const [path, entry] of Object.entries(manifest.entries)) {
      await this.materialize(this.relative(path), entry, dirs);
    }
    await this.makeDirs(dirs);
  }

  /** The workspace as a tar archive (at most 16 MiB, the files API's bound), made by tar in the sandbox. */
  async persistWorkspace(): Promise<Uint8Array> {
    await this.check(`tar -cf /tmp/${ARCHIVE} -C ${WORKSPACE} . && mv /tmp/${ARCHIVE} ${WORKSPACE}/${ARCHIVE}`, "tar -c");
    try {
      const data = await provider(() => this.sandbox.files.read(ARCHIVE));
      return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    } finally {
      await this.sandbox.files.remove(ARCHIVE).catch(() => {});
    }
  }

  /** Unpacks a tar archive of persistWorkspace into the workspace, with tar in the sandbox. */
  async hydrateWorkspace(data: WorkspaceArchiveData): Promise<void> {
    const bytes = typeof data === "string" ? Buffer.from(data, "binary") :
      data instanceof Uint8Array ? data : new Uint8Array(data);
    await provider(() => this.sandbox.files.write(ARCHIVE, bytes));
    await this.check(`tar -xf ${WORKSPACE}/${ARCHIVE} -C ${WORKSPACE}; s=$?; rm -f ${WORKSPACE}/${ARCHIVE}; exit $s`, "tar -x");
  }

  async running(): Promise<boolean> {
    try {
      await this.sandbox.get();
      return true;
    } catch {
      return false;
    }
  }

  /** Ends the live sandbox: every process killed, everything torn down. */
  async delete(): Promise<void> {
    await provider(() => this.sandbox.close());
  }

  async close(): Promise<void> {}

  // --- plumbing ---

  private async execShell(fn: () => Promise<ShellResult>, cmd: string): Promise<ShellResult> {
    try {
      return await fn();
    } catch (e) {
      if (e instanceof TransportError) throw new SandboxExecTransportError(e.message, { command: cmd });
      throw providerError(e);
    }
  }

  /** Runs a command line of the session's own to its end; a failure throws. */
  private async check(cmd: string, what: string): Promise<void> {
    const r = await provider(() => this.sandbox.exec(cmd, { timeoutMs: this.sandbox.client.timeoutMs * 10 }));
    if (r.exit_code !== 0) {
      throw new SandboxProviderError(`${what} in the sandbox exited ${r.exit_code ?? r.signal}: ${r.stderr.trim()}`,
        { exitCode: r.exit_code });
    }
  }

  /** A directory's entries, or undefined when there is no such directory. */
  private async list(rel: string) {
    try {
      return await this.sandbox.files.list(rel);
    } catch (e) {
      if (e instanceof AgentrunError && (e.status === 404 || e.status === 400)) return undefined;
      throw providerError(e);
    }
  }

  /** The type of a path of the workspace ("dir", "file", ...), undefined when there is none; never through a link. */
  private async entry(path: string): Promise<string | undefined> {
    const rel = this.relative(path);
    if (!rel) return "dir";
    const i = rel.lastIndexOf("/");
    const entries = await this.list(i < 0 ? "" : rel.slice(0, i));
    return entries?.find((f) => f.name === rel.slice(i + 1))?.type;
  }

  private async materialize(rel: string, entry: Entry, dirs: string[]): Promise<void> {
    switch (entry.type) {
      case "file":
        await provider(() => this.sandbox.files.write(rel, entry.content));
        return;
      case "local_file":
        await provider(async () => this.sandbox.files.write(rel, await readFile(entry.src)));
        return;
      case "dir": {
        const children = Object.entries(entry.children ?? {});
        if (!children.length) dirs.push(rel);
        for (const [name, child] of children) await this.materialize(rel ? `${rel}/${name}` : name, child, dirs);
        return;
      }
      default:
        throw unsupported(`a manifest entry of type ${entry.type} (agentrun writes file, local_file and dir entries)`,
          "manifestEntry", { path: rel, type: entry.type });
    }
  }

  /** Makes empty directories, with one mkdir in the sandbox. */
  private async makeDirs(dirs: string[]): Promise<void> {
    const wanted = dirs.filter((d) => d).map((d) => shellQuote(`${WORKSPACE}/${d}`));
    if (wanted.length) await this.check(`mkdir -p -- ${wanted.join(" ")}`, "mkdir");
  }

  /** A path of the workspace, relative to it; one outside it is refused. */
  private relative(path: string): string {
    const abs = path.startsWith("/") ? path : `${WORKSPACE}/${path}`;
    const parts: string[] = [];
    for (const p of abs.split("/")) {
      if (p === "" || p === ".") continue;
      if (p === "..") {
        if (!parts.length) throw outside(path);
        parts.pop();
      } else parts.push(p);
    }
    if (parts[0] !== WORKSPACE.slice(1)) throw outside(path);
    return parts.slice(1).join("/");
  }

  private absolute(path: string): string {
    const rel = this.relative(path);
    return rel ? `${WORKSPACE}/${rel}` : WORKSPACE;
  }
}

/** The SDK's result of an answer of the shell. */
function execResult(r: ShellResult, start: number): SandboxExecResult {
  let output = r.output;
  if (r.error) output += `\n[agentrun: ${r.error}]`;
  const res: SandboxExecResult = { output, stdout: r.stdout, stderr: r.stderr, wallTimeSeconds: (Date.now() - start) / 1000 };
  if (r.process !== undefined) res.sessionId = r.process;
  else res.exitCode = r.exit_code ?? (r.signal ? 128 + signalNumber(r.signal) : 1);
  return res;
}

/** An answer as the SDK's own sandboxes (and Codex) give it to the model. */
function formatExec(r: SandboxExecResult): string {
  const lines = [`Wall time: ${r.wallTimeSeconds.toFixed(4)} seconds`];
  if (typeof r.sessionId === "number") lines.push(`Process running with session ID ${r.sessionId}`);
  else if (typeof r.exitCode === "number") lines.push(`Process exited with code ${r.exitCode}`);
  lines.push("Output:", r.output);
  return lines.join("\n");
}

/** maxOutputTokens as bytes, about 4 to a token as the SDK counts. */
function outputBytes(tokens: number | undefined): number | undefined {
  return tokens === undefined || tokens === null ? undefined : Math.max(0, tokens) * 4;
}

const SIGNALS: Record<string, number> = { SIGHUP: 1, SIGINT: 2, SIGQUIT: 3, SIGKILL: 9, SIGPIPE: 13, SIGTERM: 15 };
function signalNumber(name: string): number {
  return SIGNALS[name] ?? 0;
}

/** The image type of bytes, from their first bytes; undefined when none of png, jpeg, gif, webp. */
function imageType(b: Uint8Array): string | undefined {
  const head = Buffer.from(b.subarray(0, 12));
  if (head.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]))) return "image/png";
  if (head[0] === 0xff && head[1] === 0xd8 && head[2] === 0xff) return "image/jpeg";
  if (head.subarray(0, 4).toString("latin1") === "GIF8") return "image/gif";
  if (head.subarray(0, 4).toString("latin1") === "RIFF" && head.subarray(8, 12).toString("latin1") === "WEBP") return "image/webp";
  return undefined;
}

function outside(path: string): SandboxPathResolutionError {
  return new SandboxPathResolutionError(`${path}: outside ${WORKSPACE}, the only directory agentrun's files API reaches`, { path });
}

function unsupported(what: string, feature: string, details: Record<string, unknown> = {}): SandboxUnsupportedFeatureError {
  return new SandboxUnsupportedFeatureError(`agentrun sandboxes do not support ${what}`,
    { backend: "agentrun", feature, ...details });
}

function providerError(e: unknown): unknown {
  if (!(e instanceof AgentrunError)) return e;
  return new SandboxProviderError(e.toString(), { status: e.status, field: e.field, retryAfter: e.retryAfter });
}

async function provider<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (e) {
    throw providerError(e);
  }
}

function shellQuote(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}
