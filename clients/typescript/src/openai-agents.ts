/**
 * agentrun for the OpenAI Agents SDK (`@openai/agents`, a peer
 * dependency): runCodeTool, a function tool, and AgentrunSandboxClient,
 * the SDK's sandbox client over agentrun's kept sessions.
 *
 * A sandbox session of the SDK is one kept session of agentrun serve: its
 * files outlive each call, and each exec is a fresh sandbox over them (a
 * run with the command, the session and keep_workspace). What needs a
 * sandbox that outlives a call (a process still running after exec
 * returns, writeStdin, a PTY, exposed ports, running as another user) is
 * refused with the SDK's SandboxUnsupportedFeatureError.
 *
 * @module
 */

import { readFile } from "node:fs/promises";
import { tool } from "@openai/agents";
import {
  Manifest, SandboxExecTransportError, SandboxPathResolutionError, SandboxProviderError,
  SandboxUnsupportedFeatureError, SandboxWorkspaceReadNotFoundError, normalizeSandboxClientCreateArgs,
  type Entry, type ExecCommandArgs, type ListDirectoryArgs, type MaterializeEntryArgs, type ReadFileArgs,
  type SandboxClient, type SandboxClientCreateArgs, type SandboxClientOptions, type SandboxDirectoryEntry,
  type SandboxExecResult, type SandboxSession, type SandboxSessionState, type WorkspaceArchiveData,
  type ExposedPortEndpoint, type WriteStdinArgs,
} from "@openai/agents/sandbox";
import { AgentrunError, TransportError, type Client, type RunTask } from "./index.js";
import { DEFAULT_DESCRIPTION, DEFAULT_NAME, runCode, runCodeInputSchema, type RunCodeOptions } from "./tool.js";

export type { RunCodeInput, RunCodeOptions, RunCodeOutput } from "./tool.js";

/**
 * The tool's input. The SDK's strict schemas want every field present and
 * no open-ended objects: language and files are null when not given, and
 * files is a list of {name, content}.
 */
export const runCodeInput = runCodeInputSchema("strict");

/**
 * An Agents SDK function tool that runs the model's code with client. A
 * refusal (AgentrunError) is told to the model as its reason.
 */
export function runCodeTool(client: Client, options: RunCodeOptions = {}) {
  return tool({
    name: options.name ?? DEFAULT_NAME,
    description: options.description ?? DEFAULT_DESCRIPTION,
    parameters: runCodeInput,
    execute: async (input) => runCode(client, {
      code: input.code,
      language: input.language,
      files: input.files ? Object.fromEntries(input.files.map((f) => [f.name, f.content])) : null,
    }, options),
    errorFunction: (_ctx, error) =>
      error instanceof AgentrunError ? `agentrun refused the run: ${error.toString()}` : `the run failed: ${String(error)}`,
  });
}

/** The options of every sandbox an {@link AgentrunSandboxClient} makes. */
export interface AgentrunSandboxClientOptions extends SandboxClientOptions {
  /** Task fields each exec gets: image, limits, network, runtime, timeout. */
  task?: Omit<RunTask, "code" | "command" | "session" | "keep_workspace" | "files" | "language" | "stdin">;
}

/** A sandbox session's state: the manifest and the kept session it lives in. */
export interface AgentrunSandboxSessionState extends SandboxSessionState {
  /** The kept session's id, "ss-...": a capability. */
  sessionId: string;
  environment: Record<string, string>;
}

const WORKSPACE = "/workspace";
const ARCHIVE = ".agentrun-workspace.tar";

/**
 * The Agents SDK's SandboxClient on agentrun serve: create makes a kept
 * session and writes the manifest's files into it, resume takes one up
 * again, delete removes it.
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
    const environment = await manifest.resolveEnvironment();
    const sessionId = await provider(() => this.client.sessions.create());
    const state: AgentrunSandboxSessionState = { manifest, sessionId, environment, workspaceReady: false };
    const session = new AgentrunSandboxSession(this.client, state, { ...this.options, ...(options ?? {}) });
    try {
      await session.applyManifest(manifest);
    } catch (e) {
      await this.client.sessions.delete(sessionId).catch(() => {});
      throw e;
    }
    state.workspaceReady = true;
    return session;
  }

  async resume(state: AgentrunSandboxSessionState): Promise<AgentrunSandboxSession> {
    await provider(() => this.client.sessions.get(state.sessionId));
    return new AgentrunSandboxSession(this.client, state, this.options);
  }

  async delete(state: AgentrunSandboxSessionState): Promise<void> {
    await deleteSession(this.client, state.sessionId);
  }
}

/**
 * One sandbox session of the SDK: an agentrun kept session. Each exec is
 * a fresh sandbox over its files; nothing else outlives a call.
 */
export class AgentrunSandboxSession implements SandboxSession<AgentrunSandboxSessionState> {
  constructor(private readonly client: Client, readonly state: AgentrunSandboxSessionState,
    private readonly options: AgentrunSandboxClientOptions = {}) {}

  supportsPty(): boolean {
    return false;
  }

  /** Runs cmd with /bin/sh (or args.shell) in a fresh sandbox over the session's files, to its end. */
  async exec(args: ExecCommandArgs): Promise<SandboxExecResult> {
    if (args.tty) throw unsupported("a TTY", "tty");
    if (args.runAs) throw unsupported("running as another user", "runAs");
    const start = Date.now();
    let script = args.cmd;
    if (args.workdir) script = `cd -- ${shellQuote(this.absolute(args.workdir))} && ${script}`;
    const r = await this.run([args.shell || "/bin/sh", "-c", script], true);
    return {
      output: r.stdout + r.stderr, stdout: r.stdout, stderr: r.stderr,
      wallTimeSeconds: (Date.now() - start) / 1000, exitCode: r.exit_code,
    };
  }

  async execCommand(args: ExecCommandArgs): Promise<string> {
    const r = await this.exec(args);
    return `exit code ${r.exitCode}\n${r.output}`;
  }

  async writeStdin(_args: WriteStdinArgs): Promise<string> {
    throw unsupported("writing to a process after exec returned (each exec runs to its end)", "writeStdin");
  }

  async resolveExposedPort(port: number): Promise<ExposedPortEndpoint> {
    throw unsupported("exposed ports", "exposedPorts", { port });
  }

  /** The bytes of a file of the workspace. */
  async readFile(args: ReadFileArgs): Promise<Uint8Array> {
    if (args.runAs) throw unsupported("running as another user", "runAs");
    const rel = this.relative(args.path);
    try {
      const data = await this.client.sessions.read(this.state.sessionId, rel);
      const bytes = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
      return args.maxBytes !== undefined && bytes.length > args.maxBytes ? bytes.subarray(0, args.maxBytes) : bytes;
    } catch (e) {
      if (e instanceof AgentrunError && e.status === 400) {
        throw new SandboxWorkspaceReadNotFoundError(`${args.path}: ${e.message}`, { path: args.path });
      }
      throw providerError(e);
    }
  }

  /** The entries of a directory of the workspace, by workspace-relative path. */
  async listDir(args: ListDirectoryArgs): Promise<SandboxDirectoryEntry[]> {
    if (args.runAs) throw unsupported("running as another user", "runAs");
    const rel = this.relative(args.path);
    const files = await provider(() => this.client.sessions.files(this.state.sessionId));
    if (rel && !files.some((f) => f.name === rel && f.type === "dir")) {
      throw new SandboxWorkspaceReadNotFoundError(`${args.path}: no such directory`, { path: args.path });
    }
    const prefix = rel ? rel + "/" : "";
    return files
      .filter((f) => f.name.startsWith(prefix) && !f.name.slice(prefix.length).includes("/"))
      .map((f) => ({
        name: f.name.slice(prefix.length), path: f.name,
        type: f.type === "file" ? "file" : f.type === "dir" ? "dir" : "other",
      }));
  }

  async pathExists(path: string): Promise<boolean> {
    const rel = this.relative(path);
    if (!rel) return true;
    const files = await provider(() => this.client.sessions.files(this.state.sessionId));
    return files.some((f) => f.name === rel);
  }

  async directoryExists(path: string): Promise<boolean> {
    const rel = this.relative(path);
    if (!rel) return true;
    const files = await provider(() => this.client.sessions.files(this.state.sessionId));
    return files.some((f) => f.name === rel && f.type === "dir");
  }

  /** Writes a manifest entry: a file, a local file, or a directory and its children. */
  async materializeEntry(args: MaterializeEntryArgs): Promise<void> {
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

  /** The workspace as a tar archive, made by tar in a sandbox. */
  async persistWorkspace(): Promise<Uint8Array> {
    await this.check(await this.run(["/bin/sh", "-c",
      `tar -cf /tmp/${ARCHIVE} -C ${WORKSPACE} . && mv /tmp/${ARCHIVE} ${WORKSPACE}/${ARCHIVE}`], false), "tar -c");
    const data = await provider(() => this.client.sessions.read(this.state.sessionId, ARCHIVE));
    await this.check(await this.run(["rm", "-f", `${WORKSPACE}/${ARCHIVE}`], false), "rm");
    return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  }

  /** Unpacks a tar archive of persistWorkspace into the workspace. */
  async hydrateWorkspace(data: WorkspaceArchiveData): Promise<void> {
    const bytes = typeof data === "string" ? Buffer.from(data, "binary") :
      data instanceof Uint8Array ? data : new Uint8Array(data);
    await provider(() => this.client.sessions.write(this.state.sessionId, ARCHIVE, bytes));
    await this.check(await this.run(["/bin/sh", "-c",
      `tar -xf ${WORKSPACE}/${ARCHIVE} -C ${WORKSPACE}; s=$?; rm -f ${WORKSPACE}/${ARCHIVE}; exit $s`], false), "tar -x");
  }

  async running(): Promise<boolean> {
    try {
      await this.client.sessions.get(this.state.sessionId);
      return true;
    } catch {
      return false;
    }
  }

  /** Removes the kept session and its files. */
  async delete(): Promise<void> {
    await deleteSession(this.client, this.state.sessionId);
  }

  async close(): Promise<void> {}

  // --- plumbing ---

  /** A run over the session's files: the command, the options' task, the manifest's environment. */
  private async run(command: string[], withEnv: boolean) {
    const task: RunTask = {
      ...(this.options.task ?? {}), command, session: this.state.sessionId, keep_workspace: true,
    };
    if (withEnv && Object.keys(this.state.environment ?? {}).length) {
      task.env = { ...(task.env ?? {}), ...this.state.environment };
    }
    try {
      return await this.client.run(task);
    } catch (e) {
      if (e instanceof TransportError) throw new SandboxExecTransportError(e.message, { command });
      throw providerError(e);
    }
  }

  private async check(r: { exit_code: number; stderr: string }, what: string): Promise<void> {
    if (r.exit_code !== 0) {
      throw new SandboxProviderError(`${what} in the sandbox exited ${r.exit_code}: ${r.stderr.trim()}`,
        { exitCode: r.exit_code });
    }
  }

  private async materialize(rel: string, entry: Entry, dirs: string[]): Promise<void> {
    switch (entry.type) {
      case "file":
        await provider(() => this.client.sessions.write(this.state.sessionId, rel, entry.content));
        return;
      case "local_file":
        await provider(async () => this.client.sessions.write(this.state.sessionId, rel, await readFile(entry.src)));
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

  /** Makes empty directories, in one sandbox. */
  private async makeDirs(dirs: string[]): Promise<void> {
    const wanted = dirs.filter((d) => d);
    if (wanted.length) await this.check(await this.run(["mkdir", "-p", "--", ...wanted.map((d) => this.absolute(d))], false), "mkdir");
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

function outside(path: string): SandboxPathResolutionError {
  return new SandboxPathResolutionError(`${path}: outside ${WORKSPACE}, the only directory agentrun keeps`, { path });
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

async function deleteSession(client: Client, id: string): Promise<void> {
  try {
    await client.sessions.delete(id);
  } catch (e) {
    if (!(e instanceof AgentrunError && e.status === 404)) throw providerError(e);
  }
}

function shellQuote(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}
