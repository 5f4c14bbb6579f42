/**
 * A shell for a model in one live sandbox (spec §17): Codex's pair of
 * tools, exec_command and write_stdin, as MCP's door gives them, for the
 * framework adapters to wrap. Framework-neutral: {@link Shell} runs the
 * calls, {@link shellInputSchemas} gives their inputs as zod.
 *
 * Each process's output is read in the background from the start (the
 * NDJSON stream of its POST), bounded; each answer carries what it
 * printed since the last answer about it.
 *
 * @module
 */

import { z } from "zod";
import { AgentrunError, type Client, type ProcessEvent, type Sandbox, type SandboxRequest } from "./index.js";
import { refusalText } from "./tool.js";

/** The tools' names: Codex's. */
export const EXEC_TOOL = "exec_command";
export const STDIN_TOOL = "write_stdin";

/** How long a call waits for its process's end by default, and at most (ms). */
export const DEFAULT_YIELD_MS = 10_000;
export const MAX_YIELD_MS = 30_000;
/** The most output one answer carries: past it, the first and last halves are kept and the rest counted. */
export const MAX_SHELL_OUTPUT = 64 << 10;
/** The longest cmd, and the most chars one write_stdin writes. */
export const MAX_CMD_CHARS = 64 << 10;
export const MAX_CHARS = 1 << 20;
/**
 * The most processes a shell reads at once (each a connection to serve
 * and up to MAX_SHELL_OUTPUT bytes held): past it, exec_command is
 * refused until one ends.
 */
export const MAX_RUNNING = 32;

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
  /** Output bytes left out of this answer (past MAX_SHELL_OUTPUT, or not kept by the sandbox). */
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
}

export const EXEC_DESCRIPTION =
  "Run a shell command (/bin/sh -c) in a live Linux sandbox, an unprivileged user's. " +
  "Files in /workspace (the default directory) and /tmp, and processes left running, persist from one call to the next; " +
  "each command starts in its own shell, so cd and variables do not. " +
  "The call waits up to yield_time_ms for the command to end: then the answer has its output and exit code. " +
  "A command still running then goes on in the background, and the answer has what it printed so far and its process id: " +
  "call write_stdin with that process to type into its stdin, or with empty chars to wait for more output and its exit. " +
  `An answer carries at most ${MAX_SHELL_OUTPUT} bytes of output (the middle of longer output is cut, and says so).`;

export const STDIN_DESCRIPTION =
  "Write chars to the stdin of a process that exec_command left running (a REPL, a prompt, cat), then wait " +
  "up to yield_time_ms for it to end, answering as exec_command does: the output printed since the last answer about it, " +
  "and the exit code once it has ended, else the process id again. With empty chars it only waits and reads: " +
  "the way to follow a long command. Include \"\\n\" to send a line. There is no terminal: end its input with close_stdin, " +
  "and stop it with a command such as kill.";

const YIELD_WORDS = `How long to wait for the process to end before answering with what it printed so far, in ms: ` +
  `${DEFAULT_YIELD_MS} by default, 0 to ${MAX_YIELD_MS} (a longer one is cut to ${MAX_YIELD_MS}).`;

/**
 * The tools' inputs as zod: "optional" (the AI SDK, LangChain) leaves out
 * a field not given; "strict" (the Agents SDK) wants every field, null
 * when not given.
 */
export function shellInputSchemas(form: "optional" | "strict") {
  const opt = <T extends z.ZodType>(s: T) => (form === "strict" ? s.nullable() : s.optional());
  const yieldMs = opt(z.number().int().describe(YIELD_WORDS));
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

/** The wait a call asked for, clamped. */
function yieldOf(ms: number | null | undefined): number {
  if (ms === undefined || ms === null || !Number.isFinite(ms)) return DEFAULT_YIELD_MS;
  return Math.min(Math.max(0, ms), MAX_YIELD_MS);
}

/** A process's output as read in the background: the first and the last MAX_SHELL_OUTPUT/2 bytes since the last answer, the rest counted. */
class Output {
  private head: Buffer[] = [];
  private headLen = 0;
  private tail: Buffer[] = [];
  private tailLen = 0;
  cut = 0;

  write(b: Buffer): void {
    const half = MAX_SHELL_OUTPUT / 2;
    const n = Math.min(half - this.headLen, b.length);
    if (n > 0) {
      this.head.push(b.subarray(0, n));
      this.headLen += n;
      b = b.subarray(n);
    }
    if (!b.length) return;
    this.tail.push(b);
    this.tailLen += b.length;
    while (this.tailLen > half) {
      const over = this.tailLen - half;
      const first = this.tail[0];
      if (first.length <= over) {
        this.tail.shift();
        this.tailLen -= first.length;
        this.cut += first.length;
      } else {
        this.tail[0] = first.subarray(over);
        this.tailLen -= over;
        this.cut += over;
      }
    }
  }

  /** What was kept since the last take, as text (a character cut in two replaced), and the bytes left out; then empty. */
  take(): { text: string; cut: number } {
    let text = Buffer.concat(this.head).toString("utf8");
    if (this.cut > 0) text += "\n[…]\n";
    text += Buffer.concat(this.tail).toString("utf8");
    const cut = this.cut;
    this.head = [];
    this.tail = [];
    this.headLen = this.tailLen = this.cut = 0;
    return { text, cut };
  }
}

/** A process exec_command started, its output read in the background until its exit. */
class Running {
  readonly out = new Output();
  exit?: ProcessEvent;
  failure?: unknown;
  private wake?: () => void;
  private readonly stream: AsyncGenerator<ProcessEvent, void, undefined>;
  readonly done: Promise<void>;

  constructor(stream: AsyncGenerator<ProcessEvent, void, undefined>, readonly pid: number, first: ProcessEvent[]) {
    this.stream = stream;
    for (const ev of first) this.take(ev);
    this.done = this.read();
  }

  private take(ev: ProcessEvent): void {
    if (ev.event === "exit") this.exit = ev;
    else if (ev.event === "stdout" || ev.event === "stderr" || ev.event === "pty") {
      this.out.write(ev.data_b64 ? Buffer.from(ev.data_b64, "base64") : Buffer.from(ev.data ?? "", "utf8"));
    }
    this.wake?.();
  }

  private async read(): Promise<void> {
    try {
      if (!this.exit) {
        for await (const ev of this.stream) {
          this.take(ev);
          if (this.exit) break;
        }
      }
    } catch (e) {
      this.failure = e;
    } finally {
      this.wake?.();
    }
  }

  /** Waits until it exits, its stream fails, or ms pass. */
  async wait(ms: number): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      this.done,
      new Promise<void>((resolve) => { timer = setTimeout(resolve, ms); }),
    ]);
    clearTimeout(timer);
  }

  /**
   * Stops reading: the stream is closed at its next event, or when the
   * process or the sandbox ends (a generator awaiting its connection
   * takes a return only then). The process goes on in the sandbox.
   */
  stop(): void {
    this.stream.return(undefined).catch(() => undefined);
  }
}

/**
 * exec_command and write_stdin in one live sandbox: the sandbox given,
 * or one made at the first call. close() stops reading every process and
 * ends the sandbox it made (`await using` does too).
 */
export class Shell {
  private sb?: Sandbox;
  private making?: Promise<Sandbox>;
  private readonly made: boolean;
  private readonly running = new Map<number, Running>();
  private closed = false;
  /** The lifetime, in seconds, a sandbox the shell made was given: set again at each call. */
  private idle?: number;

  constructor(readonly client: Client, private readonly options: ShellOptions = {}) {
    this.sb = options.sandbox;
    this.made = !options.sandbox;
  }

  /** The sandbox, made at the first call when none was given. */
  async sandbox(): Promise<Sandbox> {
    return (await this.current()).sb;
  }

  /**
   * The sandbox for a call. One the shell made has its lifetime set again
   * from now at each call, as long as it was given at first (its idle
   * timeout, within its max lifetime); if it had ended, a new one is made
   * and `note` says so.
   */
  private async current(): Promise<{ sb: Sandbox; note?: string }> {
    if (this.closed) throw new Error("the shell is closed");
    let note: string | undefined;
    if (this.sb) {
      if (!this.made || !this.idle) return { sb: this.sb };
      try {
        await this.sb.setTimeout(this.idle);
        return { sb: this.sb };
      } catch (e) {
        if (!(e instanceof AgentrunError) || e.status !== 404) throw e;
      }
      note = "the sandbox had ended (its lifetime or idle timeout passed): this is a new one, without the last one's files and processes";
      this.sb = undefined;
      this.running.clear();
    }
    this.making ??= this.client.sandboxes.create({ ...(this.options.create ?? {}) });
    try {
      this.sb = await this.making;
    } finally {
      this.making = undefined;
    }
    const lifetime = Math.round((Date.parse(this.sb.info.expires_at) - Date.parse(this.sb.info.created)) / 1000);
    if (lifetime > 0) this.idle = lifetime;
    return { sb: this.sb, note };
  }

  /** exec_command: runs cmd, answers when it ends or after yield_time_ms with what it printed. */
  async exec(input: ExecInput): Promise<ShellOutput> {
    const live = [...this.running.values()].filter((p) => !p.exit && !p.failure).length;
    if (live >= MAX_RUNNING) {
      return {
        output: "", error: true,
        text: `${EXEC_TOOL} refused: ${live} processes are still running, the most a shell follows; ` +
          `end one first (kill it, or close its stdin with write_stdin)`,
      };
    }
    // Ended ones whose exit no answer told yet: the oldest are forgotten past the bound.
    for (const [pid, p] of this.running) {
      if (this.running.size < MAX_RUNNING) break;
      if (p.exit || p.failure) this.running.delete(pid);
    }
    let r: Running;
    let note: string | undefined;
    let stream: AsyncGenerator<ProcessEvent, void, undefined> | undefined;
    try {
      const cur = await this.current();
      const sb = cur.sb;
      note = cur.note;
      const body: Record<string, unknown> = { cmd: input.cmd, stdin: true };
      if (input.workdir) body.cwd = input.workdir;
      // The stream lasts as long as the sandbox may: at most its max lifetime (1 h by default) and a margin.
      stream = sb.client.events("POST", sb.path("/processes"), Buffer.from(JSON.stringify(body)), 2 * 3600_000);
      const first: ProcessEvent[] = [];
      let pid: number | undefined;
      for (;;) {
        const n = await stream.next();
        if (n.done) throw new Error("the process's stream ended before its start");
        first.push(n.value);
        if (n.value.event === "start" || n.value.event === "exit") {
          pid = n.value.pid;
          break;
        }
      }
      r = new Running(stream, pid ?? 0, first);
    } catch (e) {
      stream?.return(undefined).catch(() => undefined);
      return { output: "", text: refusalText(EXEC_TOOL, e), error: true };
    }
    if (r.pid) this.running.set(r.pid, r);
    return this.answer(r, yieldOf(input.yield_time_ms), note);
  }

  /** write_stdin: writes chars (and closes stdin if asked), then answers as exec does. */
  async writeStdin(input: StdinInput): Promise<ShellOutput> {
    const r = this.running.get(input.process);
    if (!r || !this.sb) {
      return {
        output: "", error: true,
        text: `${STDIN_TOOL} refused: no process ${input.process} is running in this sandbox ` +
          `(it ended and its exit was already answered, or exec_command never gave it)`,
      };
    }
    if (input.chars || input.close_stdin) {
      try {
        await this.sb.process(r.pid).write(input.chars ?? "", Boolean(input.close_stdin));
      } catch (e) {
        return { output: "", text: refusalText(STDIN_TOOL, e), error: true };
      }
    }
    return this.answer(r, yieldOf(input.yield_time_ms));
  }

  private async answer(r: Running, ms: number, note?: string): Promise<ShellOutput> {
    if (!r.exit && !r.failure) await r.wait(ms);
    const { text: out, cut } = r.out.take();
    const res: ShellOutput = { output: out, text: "" };
    const dropped = (r.exit?.dropped_bytes ?? 0) + cut;
    if (dropped) res.cut_bytes = dropped;
    let text = note ? `[${note}]\n` + out : out;
    if (text && !text.endsWith("\n")) text += "\n";
    if (dropped) {
      text += `[output cut: an answer carries at most ${MAX_SHELL_OUTPUT} bytes, and the sandbox keeps a bounded tail ` +
        `of a process's output; ${dropped} bytes left out]\n`;
    }
    if (r.exit) {
      this.running.delete(r.pid);
      if (r.exit.signal) {
        res.signal = r.exit.signal;
        text += `[killed by ${r.exit.signal}]`;
      } else {
        res.exit_code = r.exit.exit_code;
        text += `[exit code ${r.exit.exit_code}]`;
      }
      if (r.exit.timed_out) text += " [timed out]";
    } else if (r.failure) {
      this.running.delete(r.pid);
      res.error = true;
      let why: string;
      try {
        why = refusalText(STDIN_TOOL, r.failure);
      } catch (e) {
        why = `reading its output failed: ${e instanceof Error ? e.message : String(e)}`;
      }
      text += `[process ${r.pid}: ${why}]`;
    } else {
      res.process = r.pid;
      text += `[process ${r.pid} is still running: write_stdin with process ${r.pid} reads what it prints next ` +
        `(empty chars) or writes to its stdin]`;
    }
    res.text = text;
    return res;
  }

  /**
   * Ends the sandbox if the shell made it (every process killed), and
   * stops reading every process. A sandbox given to the shell is its
   * caller's: its processes go on, and what reads them ends with them or
   * with the sandbox.
   */
  async close(): Promise<void> {
    this.closed = true;
    const all = [...this.running.values()];
    this.running.clear();
    const sb = this.sb ?? (this.making ? await this.making.catch(() => undefined) : undefined);
    this.sb = undefined;
    try {
      if (sb && this.made) await sb.close();
    } finally {
      for (const r of all) r.stop();
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}
