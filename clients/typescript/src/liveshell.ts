/**
 * Processes of a live sandbox as coding agents use them (Codex's
 * exec_command and write_stdin, the OpenAI Agents SDK's sandbox
 * sessions): a command runs until it ends or a yield time passes; one
 * still running then goes on in the sandbox, and later calls write to its
 * stdin and read what it printed since the last answer.
 *
 * The shell follows each process it started on the NDJSON stream of its
 * start (POST …/processes), read as it comes into a bounded buffer, so no
 * output is told twice or lost between answers. Nothing here outlives the
 * sandbox: its end ends every process and so every stream.
 *
 * @module
 */

import { StringDecoder } from "node:string_decoder";
import { AgentrunError, TransportError, eventBytes, type ProcessEvent, type Sandbox } from "./index.js";

/** How long exec waits for a command to end by default (ms), as Codex and the Agents SDK do. */
export const DEFAULT_EXEC_YIELD_MS = 10_000;
/** How long write waits for output by default (ms). */
export const DEFAULT_WRITE_YIELD_MS = 250;
/** The longest a call waits (ms): a longer yield time is cut to it. */
export const MAX_YIELD_MS = 30_000;
/** The output one answer carries at most (bytes): past it the middle is cut and counted. */
export const MAX_ANSWER_OUTPUT = 64 << 10;
/** The output kept for a running process between answers (bytes): past it the oldest goes, counted. */
export const MAX_PENDING_OUTPUT = 1 << 20;
/**
 * The processes one shell follows at once (each a connection to serve
 * and up to {@link MAX_PENDING_OUTPUT} bytes held): past it, exec is
 * refused until one ends; ended ones no answer told yet are forgotten
 * first, oldest first.
 */
export const MAX_RUNNING = 32;
/** The size of a terminal asked for with `tty: true`. */
export const DEFAULT_TTY = { rows: 24, cols: 80 };
// A process's stream lasts at most as long as a live sandbox can live
// (sandboxes.max_lifetime is at most 24 h): the sandbox's end closes it.
const STREAM_MS = 25 * 3600_000;

/**
 * What exec and write answer: the output since the last answer, then the
 * exit once it has ended, else the process.
 */
export interface ShellResult {
  /** stdout and stderr as they came (a terminal's output for a `tty` process), since the last answer about it. */
  output: string;
  /** Its exit code, once it has ended. */
  exit_code?: number;
  /** The signal that ended it, if one did. */
  signal?: string;
  /** Set when it was killed at its time limit. */
  timed_out?: boolean;
  /** The process (its pid in the sandbox) while it runs: give it to write. */
  process?: number;
  /** Output bytes left out of this answer: cut from its middle, or dropped here while no call read it. */
  cut_bytes?: number;
  /** Of those, the bytes dropped here while no call read it: missing from stdout and stderr too. */
  dropped_bytes?: number;
  /** Why its output can no longer be read (its stream was cut), if so. */
  error?: string;
  /** The same output, stdout's part (all of it for a `tty` process). */
  stdout: string;
  /** The same output, stderr's part. */
  stderr: string;
}

/** Options of {@link LiveShell.exec}. */
export interface ShellExecOptions {
  /** Its working directory: absolute, or relative to /workspace (the default). */
  workdir?: string;
  /** The shell that runs the line ("/bin/sh" by default, as `cmd` is run by serve). */
  shell?: string;
  /** A pseudo-terminal (true: 24 rows of 80 columns); the process then reads and prints through it. */
  tty?: boolean | { rows: number; cols: number };
  /** Variables added to its environment. */
  env?: Record<string, string>;
  /** How long to wait for it to end (ms): {@link DEFAULT_EXEC_YIELD_MS}, at most {@link MAX_YIELD_MS}. */
  yieldMs?: number;
  /** The most output the answer carries (bytes), at most {@link MAX_ANSWER_OUTPUT}. */
  maxOutputBytes?: number;
  /** Its time limit ("30s", or seconds), kept by serve; by default none but the sandbox's lifetime. */
  timeout?: string | number;
  /**
   * Wait for its end however long it takes (a program's call, not a
   * model's: yieldMs is then not used); its stdout and stderr still hold
   * at most {@link MAX_PENDING_OUTPUT} bytes, the oldest dropped past it.
   */
  untilExit?: boolean;
  /** Keep its stdin open for {@link LiveShell.write} (the default); false gives it an empty stdin. */
  stdin?: boolean;
}

/** Options of {@link LiveShell.write}. */
export interface ShellWriteOptions {
  /** How long to wait for it to end (ms): {@link DEFAULT_WRITE_YIELD_MS}, at most {@link MAX_YIELD_MS}. */
  yieldMs?: number;
  /** Close its stdin after the chars (a terminal gets its end of file, Ctrl-D). */
  closeStdin?: boolean;
  /** The most output the answer carries (bytes), at most {@link MAX_ANSWER_OUTPUT}. */
  maxOutputBytes?: number;
}

/** One process the shell follows: what it printed and not yet told, and its end. */
class Followed {
  readonly chunks: { stream: "stdout" | "stderr"; data: Buffer }[] = [];
  pending = 0;
  dropped = 0;
  done = false;
  exitCode?: number;
  signal?: string;
  timedOut = false;
  error?: string;
  private readonly wake = new Set<() => void>();
  private readonly decoders = { stdout: new StringDecoder("utf8"), stderr: new StringDecoder("utf8") };

  constructor(readonly pid: number, readonly tty: boolean,
    private readonly stream: AsyncGenerator<ProcessEvent, void, undefined>) {}

  /**
   * Stops reading: the stream is closed at its next event, or when the
   * process or the sandbox ends (a generator awaiting its connection
   * takes a return only then). The process goes on in the sandbox.
   */
  stop(): void {
    this.stream.return(undefined).catch(() => undefined);
  }

  add(ev: ProcessEvent): void {
    if (ev.event === "exit") {
      this.exitCode = ev.exit_code;
      this.signal = ev.signal || undefined;
      this.timedOut = ev.timed_out ?? false;
      // Its dropped_bytes counts what the sandbox's kept tail let go,
      // which this stream, reading all along, got (not counted here),
      // unless it lagged past that tail: serve then skips it ahead, unsaid.
      this.end();
      return;
    }
    if (ev.event !== "stdout" && ev.event !== "stderr" && ev.event !== "pty") return;
    const data = eventBytes(ev);
    this.chunks.push({ stream: ev.event === "stderr" ? "stderr" : "stdout", data });
    this.pending += data.length;
    while (this.pending > MAX_PENDING_OUTPUT) {
      const first = this.chunks[0];
      const over = this.pending - MAX_PENDING_OUTPUT;
      if (first.data.length <= over) {
        this.chunks.shift();
        this.pending -= first.data.length;
        this.dropped += first.data.length;
      } else {
        first.data = first.data.subarray(over);
        this.pending -= over;
        this.dropped += over;
      }
    }
  }

  end(error?: string): void {
    if (this.done) return;
    this.done = true;
    this.error = error;
    for (const w of this.wake) w();
  }

  /** Resolves once it has ended or ms have passed. */
  async waitFor(ms: number): Promise<void> {
    if (this.done || ms <= 0) return;
    let timer: NodeJS.Timeout | undefined;
    let wake: (() => void) | undefined;
    await new Promise<void>((resolve) => {
      wake = resolve;
      this.wake.add(resolve);
      timer = setTimeout(resolve, ms);
    });
    clearTimeout(timer);
    this.wake.delete(wake!);
  }

  /** What it printed since the last take: merged, and by stream; the bytes dropped since. */
  take(): { output: Buffer; stdout: string; stderr: string; dropped: number } {
    const out: Buffer[] = [];
    const by: Record<"stdout" | "stderr", string[]> = { stdout: [], stderr: [] };
    for (const c of this.chunks) {
      out.push(c.data);
      by[c.stream].push(this.decoders[c.stream].write(c.data));
    }
    if (this.done) for (const s of ["stdout", "stderr"] as const) by[s].push(this.decoders[s].end());
    this.chunks.length = 0;
    this.pending = 0;
    const dropped = this.dropped;
    this.dropped = 0;
    return { output: Buffer.concat(out), stdout: by.stdout.join(""), stderr: by.stderr.join(""), dropped };
  }
}

/**
 * A shell on one live sandbox ({@link Client.sandboxes}): exec a command
 * line, then write to it and read it while it runs. It follows at most
 * {@link MAX_RUNNING} processes at once and keeps at most
 * {@link MAX_PENDING_OUTPUT} bytes of each one's output between answers.
 */
export class LiveShell {
  private readonly followed = new Map<number, Followed>();

  /** @param env variables every command gets (a manifest's environment), under its own. */
  constructor(readonly sandbox: Sandbox, private readonly env: Record<string, string> = {}) {}

  /**
   * Runs cmd (a shell line) and answers when it ends or after the yield
   * time, whichever is first: its output as it came, and stdout and
   * stderr apart (a terminal's output is stdout). A refusal throws
   * AgentrunError.
   */
  async exec(cmd: string, options: ShellExecOptions = {}): Promise<ShellResult> {
    // Ended ones whose exit no answer told yet are forgotten first, oldest first.
    for (const [pid, p] of this.followed) {
      if (this.followed.size < MAX_RUNNING) break;
      if (p.done) this.followed.delete(pid);
    }
    if (this.followed.size >= MAX_RUNNING) {
      throw new AgentrunError(`${this.followed.size} processes are still running, the most a shell follows: ` +
        "end one first (write Ctrl-C to it, close its stdin, or kill it)");
    }
    const req: Record<string, unknown> = options.shell ? { command: [options.shell, "-c", cmd] } : { cmd };
    if (options.workdir) req.cwd = options.workdir;
    const env = { ...this.env, ...(options.env ?? {}) };
    if (Object.keys(env).length) req.env = env;
    req.stdin = options.stdin ?? true;
    if (options.tty) req.tty = options.tty === true ? DEFAULT_TTY : options.tty;
    if (options.timeout !== undefined) req.timeout = typeof options.timeout === "number" ? `${options.timeout}s` : options.timeout;
    const events = this.sandbox.client.events("POST", this.sandbox.path("/processes"),
      Buffer.from(JSON.stringify(req)), STREAM_MS);
    const first = await events.next(); // a refusal throws here
    if (first.done || first.value.event !== "start" || first.value.pid === undefined) {
      await events.return(undefined);
      throw new TransportError("the process's stream did not begin with its start");
    }
    const p = new Followed(first.value.pid, Boolean(options.tty), events);
    this.followed.set(p.pid, p);
    void (async () => {
      try {
        for await (const ev of events) p.add(ev);
        p.end("its output stream ended before its exit");
      } catch (e) {
        p.end(`its output stream was cut: ${e instanceof Error ? e.message : String(e)}`);
      }
    })();
    await p.waitFor(options.untilExit ? STREAM_MS : yieldTime(options.yieldMs, DEFAULT_EXEC_YIELD_MS));
    return this.answer(p, options.maxOutputBytes);
  }

  /**
   * Writes chars to the stdin of a process exec left running, then
   * answers as exec does after the yield time. Ctrl-C ("\u0003") to a
   * process without a terminal is sent as SIGINT. A process this shell
   * does not follow is refused (AgentrunError, field "process").
   */
  async write(pid: number, chars: string, options: ShellWriteOptions = {}): Promise<ShellResult> {
    const p = this.followed.get(pid);
    if (!p) {
      throw new AgentrunError(`no process ${pid} is running in this sandbox ` +
        "(it ended and its exit was already answered, or exec_command never gave it)", { field: "process" });
    }
    let data = chars;
    const proc = this.sandbox.process(pid);
    try {
      if (!p.tty && data.includes("\u0003")) {
        data = data.split("\u0003").join("");
        if (!p.done) await proc.signal("SIGINT");
      }
      if ((data || options.closeStdin) && !p.done) await proc.write(data, options.closeStdin ?? false);
    } catch (e) {
      // 409: it ended (or closed its stdin) meanwhile; its answer says so.
      if (!(e instanceof AgentrunError && e.status === 409)) throw e;
    }
    await p.waitFor(yieldTime(options.yieldMs, DEFAULT_WRITE_YIELD_MS));
    return this.answer(p, options.maxOutputBytes);
  }

  /** The pids of the processes it follows that have not been read to their end. */
  processes(): number[] {
    return [...this.followed.keys()];
  }

  /** Stops reading every process it follows (they go on in the sandbox) and forgets them. */
  stop(): void {
    for (const p of this.followed.values()) p.stop();
    this.followed.clear();
  }

  private answer(p: Followed, maxOutputBytes?: number): ShellResult {
    const got = p.take();
    const max = Math.min(MAX_ANSWER_OUTPUT, maxOutputBytes !== undefined && maxOutputBytes >= 0 ? maxOutputBytes : MAX_ANSWER_OUTPUT);
    const { text, cut } = cutMiddle(got.output, max, got.dropped);
    const a: ShellResult = { output: text, stdout: got.stdout, stderr: got.stderr };
    if (p.done) {
      this.followed.delete(p.pid);
      if (p.exitCode !== undefined) a.exit_code = p.exitCode;
      if (p.signal) a.signal = p.signal;
      if (p.timedOut) a.timed_out = true;
      if (p.error) a.error = p.error;
    } else {
      a.process = p.pid;
    }
    if (cut > 0) a.cut_bytes = cut;
    if (got.dropped > 0) a.dropped_bytes = got.dropped;
    return a;
  }
}

function yieldTime(ms: number | undefined, dflt: number): number {
  if (ms === undefined || ms === null || !Number.isFinite(ms) || ms < 0) return dflt;
  return Math.min(ms, MAX_YIELD_MS);
}

/**
 * data as UTF-8 cut to max bytes by leaving out its middle, with a mark
 * saying how many bytes went in all, counting `before` bytes that went
 * before data was kept (marked at its start when nothing else is cut).
 */
export function cutMiddle(data: Buffer, max: number, before = 0): { text: string; cut: number } {
  if (data.length <= max) {
    const text = data.toString("utf8");
    return { text: before ? `[… ${before} bytes of output cut …]\n${text}` : text, cut: before };
  }
  const half = Math.floor(max / 2);
  const cut = data.length - 2 * half + before;
  const head = data.subarray(0, half).toString("utf8").replace(/\uFFFD$/, "");
  const tail = data.subarray(data.length - half).toString("utf8").replace(/^\uFFFD/, "");
  return { text: `${head}\n[… ${cut} bytes of output cut …]\n${tail}`, cut };
}
