/**
 * agentrun as a deepagents backend (`deepagents`, a peer dependency): a
 * live sandbox of agentrun serve (spec §17) as deepagents' sandbox
 * backend protocol. execute runs a shell line in the sandbox, uploadFiles
 * and downloadFiles go through serve's file API (link-safe, bounded);
 * deepagents' BaseSandbox builds the rest (ls, read, write, edit, glob,
 * grep) on them.
 *
 *     import { createDeepAgent } from "deepagents";
 *     import { AgentrunSandbox } from "agentrun/deepagents";
 *     await using backend = await AgentrunSandbox.create(new Client(), { timeout: "30m" });
 *     const agent = createDeepAgent({ model, backend });
 *
 * Files are the sandbox's /workspace (the file API's reach, and
 * execute's working directory): a path elsewhere is "invalid_path" to
 * uploadFiles and downloadFiles.
 *
 * @module
 */

import {
  BaseSandbox, type ExecuteResponse, type FileDownloadResponse, type FileOperationError, type FileUploadResponse,
} from "deepagents";
import { AgentrunError, TransportError, type Client, type Sandbox, type SandboxRequest } from "./index.js";
import { LiveShell, MAX_PENDING_OUTPUT, type ShellResult } from "./liveshell.js";
import { refusalText } from "./tool.js";

/** The most output one execute answers (the follower's bound on output kept unread); past it, the oldest is dropped and `truncated` set. */
export const MAX_EXECUTE_OUTPUT = MAX_PENDING_OUTPUT;

/** Options of an {@link AgentrunSandbox}. */
export interface AgentrunSandboxOptions {
  /** Each execute's time limit in seconds ("30s" or seconds); by default 30 minutes; 0 for none but the sandbox's lifetime. */
  execTimeout?: string | number;
}

/**
 * deepagents' sandbox backend on a live sandbox of agentrun serve. One
 * made by {@link AgentrunSandbox.create} is ended by close() (or the end
 * of an `await using` block); one made on a {@link Sandbox} given is its
 * caller's to end.
 */
export class AgentrunSandbox extends BaseSandbox {
  readonly id: string;
  readonly sandbox: Sandbox;
  private readonly made: boolean;
  private readonly execTimeout: string | number | undefined;
  private readonly shell: LiveShell;

  constructor(sandbox: Sandbox, options: AgentrunSandboxOptions = {}, made = false) {
    super();
    this.sandbox = sandbox;
    this.id = sandbox.id;
    this.made = made;
    this.shell = new LiveShell(sandbox);
    const t = options.execTimeout ?? 1800;
    this.execTimeout = t === 0 || t === "0" ? undefined : t;
  }

  /** Makes a live sandbox with req (image, limits, network, env, timeout its lifetime) and a backend on it. */
  static async create(client: Client, req: Omit<SandboxRequest, "timeout"> & { timeout?: string | number } = {},
    options: AgentrunSandboxOptions = {}): Promise<AgentrunSandbox> {
    return new AgentrunSandbox(await client.sandboxes.create(req), options, true);
  }

  /**
   * Runs command (by /bin/sh -c, in /workspace) to its end, followed by
   * the package's one process follower ({@link LiveShell}): stdout then
   * stderr as output, at most MAX_EXECUTE_OUTPUT bytes kept (the oldest
   * dropped past it, `truncated` set); exitCode null when a signal ended
   * it. `options.timeout` (seconds) overrides the backend's. A refusal is
   * the output, in the words the adapters' tools use.
   */
  async execute(command: string, options: { timeout?: number } = {}): Promise<ExecuteResponse> {
    const timeout = options.timeout === undefined ? this.execTimeout : options.timeout || undefined;
    let r: ShellResult;
    try {
      r = await this.shell.exec(command, { timeout, untilExit: true, stdin: false, maxOutputBytes: 0 });
    } catch (e) {
      return { output: refusalText("execute", e), exitCode: null, truncated: false };
    }
    const { stdout, stderr } = r;
    let output = stdout && stderr ? `${stdout}${stdout.endsWith("\n") ? "" : "\n"}${stderr}` : stdout || stderr;
    const note = r.timed_out ? "timed out: killed at its time limit" : r.signal ? `killed by ${r.signal}` : r.error;
    if (note) output += `${output && !output.endsWith("\n") ? "\n" : ""}[${note}]`;
    return { output, exitCode: r.signal || r.exit_code === undefined ? null : r.exit_code, truncated: Boolean(r.dropped_bytes) };
  }

  /** Writes each file (at most 16 MiB) in /workspace; each answered on its own. */
  async uploadFiles(files: Array<[string, Uint8Array]>): Promise<FileUploadResponse[]> {
    const res: FileUploadResponse[] = [];
    for (const [path, content] of files) {
      try {
        await this.sandbox.files.write(path, content);
        res.push({ path, error: null });
      } catch (e) {
        res.push({ path, error: await this.refusedCode(path, e) });
      }
    }
    return res;
  }

  /** Reads each file (at most 16 MiB) of /workspace; each answered on its own. */
  async downloadFiles(paths: string[]): Promise<FileDownloadResponse[]> {
    const res: FileDownloadResponse[] = [];
    for (const path of paths) {
      try {
        res.push({ path, content: new Uint8Array(await this.sandbox.files.read(path)), error: null });
      } catch (e) {
        res.push({ path, content: null, error: await this.refusedCode(path, e) });
      }
    }
    return res;
  }

  /**
   * deepagents' code for a refused read or write of path: serve refuses
   * anything but a regular file alike (and a place's root as "invalid"),
   * so a directory is told by listing it.
   */
  private async refusedCode(path: string, e: unknown): Promise<FileOperationError> {
    const code = fileError(e);
    if (code !== "invalid_path" || !(e instanceof AgentrunError) || e.status !== 400) return code;
    try {
      await this.sandbox.files.list(path);
      return "is_directory";
    } catch {
      return code;
    }
  }

  /** Ends the sandbox if this backend made it. */
  async close(): Promise<void> {
    this.shell.stop();
    if (this.made) await this.sandbox.close();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/**
 * deepagents' code for a refused file call: none there, a directory, a
 * path the file API does not take (outside /workspace, through a link,
 * too large); no answer from serve is thrown.
 */
function fileError(e: unknown): FileOperationError {
  if (!(e instanceof AgentrunError) || e instanceof TransportError) throw e;
  if (e.status === 404) return "file_not_found";
  if (/is a directory/i.test(e.message)) return "is_directory";
  if (e.status === 403) return "permission_denied";
  return "invalid_path";
}
