/**
 * A shell for a model in one live sandbox (spec §17): Codex's pair of
 * tools, exec_command and write_stdin, as MCP's door gives them, for the
 * framework adapters to wrap. Framework-neutral: {@link Shell} runs the
 * calls, {@link shellInputSchemas} gives their inputs as zod.
 *
 * The processes are followed by a {@link LiveShell} (the one follower of
 * the package, which the Agents SDK's sandbox session uses too): each
 * one's output is read in the background from its start, bounded; each
 * answer carries what it printed since the last answer about it.
 *
 * @module
 */

import { z } from "zod";
import { AgentrunError, type Client, type Sandbox, type SandboxRequest } from "./index.js";
import {
  DEFAULT_EXEC_YIELD_MS, LiveShell, MAX_ANSWER_OUTPUT, MAX_PENDING_OUTPUT, MAX_RUNNING, MAX_YIELD_MS, type ShellResult,
} from "./liveshell.js";
import { refusalText } from "./tool.js";

/** The tools' names: Codex's. */
export const EXEC_TOOL = "exec_command";
export const STDIN_TOOL = "write_stdin";

/** The longest cmd, and the most chars one write_stdin writes. */
export const MAX_CMD_CHARS = 64 << 10;
export const MAX_CHARS = 1 << 20;

/** exec_command's input. */
export interface ExecInput {
  cmd: string;
  workdir?: string | null;
  yield_time_ms?: number | null;
}

/** write_stdin's input. */
export interface StdinInput {
  process: number;
  chars?: string | null;
  close_stdin?: boolean | null;
  yield_time_ms?: number | null;
}

/**
 * An answer of exec_command or write_stdin: the output printed since the
 * last answer about the process (stdout and stderr as they came), then
 * its exit code once it has ended, or its id while it runs; `text` is
 * what the model reads; `error` a refusal, said in `text`.
 */
export interface ShellOutput {
  output: string;
  exit_code?: number;
  signal?: string;
  process?: number;
  /** Set when it was killed at its time limit. */
  timed_out?: boolean;
  /** Output bytes left out of this answer (its middle past MAX_ANSWER_OUTPUT, or past MAX_PENDING_OUTPUT unread). */
  cut_bytes?: number;
  text: string;
  error?: boolean;
}

/** Options of a {@link Shell}. */
export interface ShellOptions {
  /** The live sandbox to use; the caller ends it. Without it, one is made at the first call and ended by close(). */
  sandbox?: Sandbox;
  /** The request of the sandbox made at the first call (image, limits, network, env, timeout). */
  create?: Omit<SandboxRequest, "timeout"> & { timeout?: string | number };
  /**
   * Run each command on a pseudo-terminal (true: 24 rows of 80
   * columns): programs see a terminal (prompts, colours, line editing),
   * its output is one stream, and write_stdin's "\u0003" is Ctrl-C.
   */
  tty?: boolean | { rows: number; cols: number };
}

export const EXEC_DESCRIPTION =
  "Run a shell command (/bin/sh -c) in a live Linux sandbox, an unprivileged user's. " +
  "Files in /workspace (the default directory) and /tmp, and processes left running, persist from one call to the next; " +
  "each command starts in its own shell, so cd and variables do not. " +
  "The call waits up to yield_time_ms for the command to end: then the answer has its output and exit code. " +
  "A command still running then goes on in the background, and the answer has what it printed so far and its process id: " +
  "call write_stdin with that process to type into its stdin, or with empty chars to wait for more output and its exit. " +
  `An answer carries at most ${MAX_ANSWER_OUTPUT} bytes of output (the middle of longer output is cut, and says so).`;

const STDIN_DESCRIPTION_START =
  "Write chars to the stdin of a process that exec_command left running (a REPL, a prompt, cat), then wait " +
  "up to yield_time_ms for it to end, answering as exec_command does: the output printed since the last answer about it, " +
  "and the exit code once it has ended, else the process id again. With empty chars it only waits and reads: " +
  "the way to follow a long command. Include \"\\n\" to send a line. ";

/** write_stdin's description: stopping a process differs on a terminal. */
export function stdinDescription(tty = false): string {
  return STDIN_DESCRIPTION_START + (tty
    ? "Each command has a terminal: \"\\u0003\" is Ctrl-C, \"\\u0004\" (or close_stdin) the end of its input."
    : "There is no terminal: end its input with close_stdin, and stop it with \"\\u0003\" (sent as SIGINT) or a command such as kill.");
}

/** write_stdin's description, without a terminal. */
export const STDIN_DESCRIPTION = stdinDescription();

const YIELD_WORDS = `How long to wait for the process to end before answering with what it printed so far, in ms: ` +
  `${DEFAULT_EXEC_YIELD_MS} by default, 0 to ${MAX_YIELD_MS} (a longer one is cut to ${MAX_YIELD_MS}).`;

/**
 * The tools' inputs as zod: "optional" (the AI SDK, LangChain) leaves out
 * a field not given; "strict" (the Agents SDK) wants every field, null
 * when not given.
 */
export function shellInputSchemas(form: "optional" | "strict") {
  const opt = <T extends z.ZodType>(s: T) => (form === "strict" ? s.nullable() : s.optional());
  const yieldMs = opt(z.number().int().min(0).describe(YIELD_WORDS));
  return {
    exec: z.object({
      cmd: z.string().min(1).max(MAX_CMD_CHARS)
        .describe("The shell command line, run by /bin/sh -c, e.g. \"ls -la\" or \"python3 -m pytest -q 2>&1 | tail -20\"."),
      workdir: opt(z.string().max(4096).describe("Its working directory: absolute, or relative to /workspace (the default).")),
      yield_time_ms: yieldMs,
    }),
    stdin: z.object({
      process: z.number().int().min(1).describe("The process id an answer of exec_command (or write_stdin) gave."),
      chars: opt(z.string().max(MAX_CHARS).describe("Text to write to its stdin; empty to only read what it printed since.")),
      close_stdin: opt(z.boolean().describe("After chars, close its stdin: the end of its input (as ^D at a terminal).")),
      yield_time_ms: yieldMs,
    }),
  };
}

/**
 * exec_command and write_stdin in one live sandbox: the sandbox given,
 * or one made at the first call. close() stops reading every process and
 * ends the sandbox it made (`await using` does too). It follows at most
 * {@link MAX_RUNNING} processes, each with at most
 * {@link MAX_PENDING_OUTPUT} bytes kept unread.
 */
export class Shell {
  private sb?: Sandbox;
  private live?: LiveShell;
  private making?: Promise<Sandbox>;
  private readonly made: boolean;
  private closed = false;
  /** The lifetime, in seconds, a sandbox the shell made was given: set again at each call. */
  private idle?: number;

  constructor(readonly client: Client, private readonly options: ShellOptions = {}) {
    this.sb = options.sandbox;
    this.made = !options.sandbox;
    if (this.sb) this.live = new LiveShell(this.sb);
  }

  /** The sandbox, made at the first call when none was given. */
  async sandbox(): Promise<Sandbox> {
    return (await this.current()).sb;
  }

  /**
   * The sandbox for a call and its follower. One the shell made has its
   * lifetime set again from now at each call, as long as it was given at
   * first (its idle timeout, within its max lifetime); if it had ended, a
   * new one is made and `note` says so.
   */
  private async current(): Promise<{ sb: Sandbox; live: LiveShell; note?: string }> {
    if (this.closed) throw new Error("the shell is closed");
    let note: string | undefined;
    if (this.sb && this.live) {
      if (!this.made || !this.idle) return { sb: this.sb, live: this.live };
      try {
        await this.sb.setTimeout(this.idle);
        return { sb: this.sb, live: this.live };
      } catch (e) {
        if (!(e instanceof AgentrunError) || e.status !== 404) throw e;
      }
      note = "the sandbox had ended (its lifetime or idle timeout passed): this is a new one, without the last one's files and processes";
      this.live.stop();
      this.sb = this.live = undefined;
    }
    this.making ??= this.client.sandboxes.create({ ...(this.options.create ?? {}) });
    let sb: Sandbox;
    try {
      sb = await this.making;
    } finally {
      this.making = undefined;
    }
    const lifetime = Math.round((Date.parse(sb.info.expires_at) - Date.parse(sb.info.created)) / 1000);
    if (lifetime > 0) this.idle = lifetime;
    this.sb = sb;
    this.live = new LiveShell(sb);
    return { sb, live: this.live, note };
  }

  /** exec_command: runs cmd, answers when it ends or after yield_time_ms with what it printed. */
  async exec(input: ExecInput): Promise<ShellOutput> {
    let note: string | undefined;
    let r: ShellResult;
    try {
      const cur = await this.current();
      note = cur.note;
      r = await cur.live.exec(input.cmd, {
        workdir: input.workdir ?? undefined, tty: this.options.tty, yieldMs: yieldOf(input.yield_time_ms),
      });
    } catch (e) {
      return { output: "", text: refusalText(EXEC_TOOL, e), error: true };
    }
    return shellOutput(r, note);
  }

  /** write_stdin: writes chars (and closes stdin if asked), then answers as exec does. */
  async writeStdin(input: StdinInput): Promise<ShellOutput> {
    if (!this.live?.processes().includes(input.process)) {
      return {
        output: "", error: true,
        text: `${STDIN_TOOL} refused: no process ${input.process} is running in this sandbox ` +
          `(it ended and its exit was already answered, or exec_command never gave it)`,
      };
    }
    try {
      return shellOutput(await this.live.write(input.process, input.chars ?? "", {
        closeStdin: Boolean(input.close_stdin), yieldMs: yieldOf(input.yield_time_ms),
      }));
    } catch (e) {
      return { output: "", text: refusalText(STDIN_TOOL, e), error: true };
    }
  }

  /**
   * Ends the sandbox if the shell made it (every process killed), and
   * stops reading every process. A sandbox given to the shell is its
   * caller's: its processes go on, and what reads them ends with them or
   * with the sandbox.
   */
  async close(): Promise<void> {
    this.closed = true;
    const live = this.live;
    const sb = this.sb ?? (this.making ? await this.making.catch(() => undefined) : undefined);
    this.sb = this.live = undefined;
    try {
      if (sb && this.made) await sb.close();
    } finally {
      live?.stop();
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/** The wait a call asked for: {@link DEFAULT_EXEC_YIELD_MS} when none, as MCP's door waits for either tool (the follower clamps it). */
function yieldOf(ms: number | null | undefined): number {
  return ms ?? DEFAULT_EXEC_YIELD_MS;
}

/**
 * The answer of a follower's result: its fields, and the text a model
 * reads, in the words of MCP's exec_command.
 */
export function shellOutput(r: ShellResult, note?: string): ShellOutput {
  const res: ShellOutput = { output: r.output, text: "" };
  let text = note ? `[${note}]\n` + r.output : r.output;
  if (text && !text.endsWith("\n")) text += "\n";
  if (r.cut_bytes) {
    res.cut_bytes = r.cut_bytes;
    text += `[output cut: an answer carries at most ${MAX_ANSWER_OUTPUT} bytes, and at most ${MAX_PENDING_OUTPUT} bytes ` +
      `of a process's output are kept unread; ${r.cut_bytes} bytes left out]\n`;
  }
  if (r.process !== undefined) {
    res.process = r.process;
    text += `[process ${r.process} is still running: write_stdin with process ${r.process} reads what it prints next ` +
      `(empty chars) or writes to its stdin]`;
  } else if (r.error) {
    res.error = true;
    text += `[${r.error}]`;
  } else if (r.signal) {
    res.signal = r.signal;
    text += `[killed by ${r.signal}]`;
  } else {
    res.exit_code = r.exit_code;
    text += `[exit code ${r.exit_code}]`;
  }
  if (r.timed_out) {
    res.timed_out = true;
    text += " [timed out]";
  }
  res.text = text;
  return res;
}
