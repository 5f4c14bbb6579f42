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

/** The most output one execute answers; past it, the output is cut and `truncated` set. */
export const MAX_EXECUTE_OUTPUT = 1 << 20;

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

  constructor(sandbox: Sandbox, options: AgentrunSandboxOptions = {}, made = false) {
    super();
    this.sandbox = sandbox;
    this.id = sandbox.id;
    this.made = made;
    const t = options.execTimeout ?? 1800;
    this.execTimeout = t === 0 || t === "0" ? undefined : t;
  }

  /** Makes a live sandbox with req (image, limits, network, env, timeout its lifetime) and a backend on it. */
  static async create(client: Client, req: Omit<SandboxRequest, "timeout"> & { timeout?: string | number } = {},
    options: AgentrunSandboxOptions = {}): Promise<AgentrunSandbox> {
    return new AgentrunSandbox(await client.sandboxes.create(req), options, true);
  }

  /**
   * Runs command (by /bin/sh -c, in /workspace): stdout then stderr as
   * output, at most MAX_EXECUTE_OUTPUT bytes; exitCode null when a
   * signal ended it. `options.timeout` (seconds) overrides the backend's.
   */
  async execute(command: string, options: { timeout?: number } = {}): Promise<ExecuteResponse> {
    const timeout = options.timeout === undefined ? this.execTimeout : options.timeout || undefined;
    const out: Record<"stdout" | "stderr", Buffer[]> = { stdout: [], stderr: [] };
    let kept = 0;
    let truncated = false;
    let exitCode: number | null = null;
    let signal = "";
    let timedOut = false;
    try {
      // The answer may take as long as the process may run, and a margin.
      const timeoutMs = typeof timeout === "number" ? (timeout + 60) * 1000 : 2 * 3600_000;
      for await (const ev of this.sandbox.execStream(command, { timeout, timeoutMs })) {
        if (ev.event === "stdout" || ev.event === "stderr") {
          const b = ev.data_b64 ? Buffer.from(ev.data_b64, "base64") : Buffer.from(ev.data ?? "", "utf8");
          const room = MAX_EXECUTE_OUTPUT - kept;
          if (b.length > room) truncated = true;
          if (room > 0) {
            out[ev.event].push(b.subarray(0, room));
            kept += Math.min(room, b.length);
          }
        } else if (ev.event === "exit") {
          exitCode = ev.signal ? null : ev.exit_code ?? null;
          signal = ev.signal ?? "";
          timedOut = ev.timed_out ?? false;
          if (ev.dropped_bytes) truncated = true;
        }
      }
    } catch (e) {
      if (!(e instanceof AgentrunError) || e instanceof TransportError) throw e;
      return { output: `execute refused: ${e.field ? e.field + ": " : ""}${e.message}`, exitCode: null, truncated: false };
    }
    const stdout = Buffer.concat(out.stdout).toString("utf8");
    const stderr = Buffer.concat(out.stderr).toString("utf8");
    let output = stdout && stderr ? `${stdout}${stdout.endsWith("\n") ? "" : "\n"}${stderr}` : stdout || stderr;
    if (timedOut) output += `${output && !output.endsWith("\n") ? "\n" : ""}[timed out: killed at its time limit]`;
    else if (signal) output += `${output && !output.endsWith("\n") ? "\n" : ""}[killed by ${signal}]`;
    return { output, exitCode, truncated };
  }

  /** Writes each file (at most 16 MiB) in /workspace; each answered on its own. */
  async uploadFiles(files: Array<[string, Uint8Array]>): Promise<FileUploadResponse[]> {
    const res: FileUploadResponse[] = [];
    for (const [path, content] of files) {
      try {
        await this.sandbox.files.write(path, content);
        res.push({ path, error: null });
      } catch (e) {
        res.push({ path, error: fileError(e) });
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
        res.push({ path, content: null, error: fileError(e) });
      }
    }
    return res;
  }

  /** Ends the sandbox if this backend made it. */
  async close(): Promise<void> {
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
