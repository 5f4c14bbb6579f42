/**
 * What the adapters' run_code tools share: a call's input, the options a
 * program sets for every call, and the answer the model is given.
 *
 * @module
 */

import { z } from "zod";
import { AgentrunError, TransportError, type Client, type Context, type Result, type RunTask } from "./index.js";
import { RUN_CODE_INPUT } from "./task.js";

/** What the model gives a run_code tool. */
export interface RunCodeInput {
  /** The program. */
  code: string;
  /** A language of the server's config ("python", "node", "bash", "sh"); by default options.language, else the server's. */
  language?: string | null;
  /** Text files written into /workspace before the run, by relative name. */
  files?: Record<string, string> | null;
}

/** What the program, not the model, decides for every call of a run_code tool. */
export interface RunCodeOptions {
  /** The tool's name ("run_code"). */
  name?: string;
  /** The tool's description, as the model reads it. */
  description?: string;
  /** The language when the model names none. */
  language?: string;
  /** Task fields every call gets: image, limits, network, env, runtime, timeout, session, keep_workspace... */
  task?: Omit<RunTask, "code" | "language" | "files" | "command">;
  /**
   * A kept session whose Python globals carry from one call to the next
   * (keep_state): the model's calls share their state, each still a
   * fresh sandbox. The caller makes and removes the session.
   */
  session?: string;
  /** As session, with a {@link Context}'s session and its tool servers (unless task names its own). */
  context?: Context;
}

/** What the model gets back: the run's outcome, its output as kept. */
export interface RunCodeOutput {
  exit_code: number;
  stdout: string;
  stderr: string;
  timed_out: boolean;
  oom_killed: boolean;
  stdout_truncated: boolean;
  stderr_truncated: boolean;
  duration_ms: number;
  /** A final expression's value, as text/plain. */
  value?: string;
  /** A stateful call's report on the state it left. */
  state?: Result["state"];
}

type Properties = typeof RUN_CODE_INPUT.properties;
type Field = keyof Properties;
type Text = z.ZodString;
type NamedText = z.ZodObject<{ name: Text; content: Text }>;
/** A field's value: text, or a map of names to text (files)... */
type Value<F extends Field> = Properties[F] extends { type: "object" } ? z.ZodRecord<Text, Text> : Text;
/** ...which the strict form gives as a list of {name, content}. */
type StrictValue<F extends Field> = Properties[F] extends { type: "object" } ? z.ZodArray<NamedText> : Text;
type Given = (typeof RUN_CODE_INPUT.required)[number];

/** The input of the AI SDK's and LangChain's run_code tools: a field not given is absent. */
export type OptionalInputSchema = z.ZodObject<{ [F in Field]: F extends Given ? Value<F> : z.ZodOptional<Value<F>> }>;
/**
 * The input of the Agents SDK's run_code tool. Its strict schemas want
 * every field present and no open-ended objects: a field not given is
 * null, and a map is a list of {name, content}.
 */
export type StrictInputSchema = z.ZodObject<{ [F in Field]: F extends Given ? StrictValue<F> : z.ZodNullable<StrictValue<F>> }>;

/** What the model reads of each field of its input, in each form. */
const WORDS: Record<Field, { optional: string; strict: string }> = {
  code: { optional: "The program to run.", strict: "The program to run." },
  language: {
    optional: "Its language: python, node, bash or sh.",
    strict: "Its language: python, node, bash or sh; null for the default.",
  },
  files: {
    optional: "Text files written into the working directory first, by relative name.",
    strict: "Text files written into the working directory first; null for none.",
  },
};

/**
 * A run_code tool's input as zod, from the one definition of it
 * (RUN_CODE_INPUT, task.json's code, language and files as the OpenAPI
 * document types them): "optional" for the AI SDK and LangChain, "strict"
 * for the Agents SDK.
 */
export function runCodeInputSchema(form: "optional"): OptionalInputSchema;
export function runCodeInputSchema(form: "strict"): StrictInputSchema;
export function runCodeInputSchema(form: "optional" | "strict"): z.ZodObject {
  const required: readonly string[] = RUN_CODE_INPUT.required;
  const shape: Record<string, z.ZodType> = {};
  for (const [name, p] of Object.entries(RUN_CODE_INPUT.properties) as [Field, Properties[Field]][]) {
    let s: z.ZodType = p.type === "string" ? z.string()
      : form === "strict" ? z.array(z.object({ name: z.string(), content: z.string() }))
      : z.record(z.string(), z.string());
    if (!required.includes(name)) s = form === "strict" ? s.nullable() : s.optional();
    shape[name] = s.describe(WORDS[name][form]);
  }
  return z.object(shape);
}

export const DEFAULT_NAME = "run_code";
export const DEFAULT_DESCRIPTION =
  "Runs a program in a fresh, locked-down Linux sandbox and returns its exit code, stdout and stderr. " +
  "In Python, the value of a final expression comes back as a notebook shows it, and matplotlib figures " +
  "(plt.show(), or still open at the end) as images. " +
  "Nothing outlives the call unless the sandbox's workspace is kept; the network is closed unless allowed.";

/** The description of a stateful tool (options.session or options.context). */
export const STATEFUL_DESCRIPTION =
  "Runs Python in a fresh, locked-down Linux sandbox, as a notebook cell: the globals that earlier calls left " +
  "(variables, functions, classes, imports) are there, and what this call defines is kept for the next. " +
  "The answer has the exit code, stdout and stderr, the value of a final expression, and matplotlib figures " +
  "(plt.show(), or still open at the end) as images. Processes, open files and sockets do not carry over; " +
  "the network is closed unless allowed.";

/** The most of a value's text/html an answer carries; past it, the html is cut and the cut said. */
export const MAX_HTML = 16 << 10;
/** The most of a value's text/plain (or other text) an answer carries; past it, the text is cut and the cut said. */
export const MAX_TEXT = 64 << 10;

/** An image of an answer: a figure, or an image value; data is base64. */
export interface Figure {
  mimeType: "image/png" | "image/jpeg";
  data: string;
}

/**
 * A run_code call's answer as a model reads it: `text` (output, how the
 * run ended, the value and what was cut), `figures` (images, in order:
 * displayed figures, then the value's), and `output` the result's fields
 * for the program. A refusal the model can act on is `error`, with the
 * reason (and the task field) as `text`.
 */
export interface RunCodeAnswer {
  text: string;
  figures: Figure[];
  output?: RunCodeOutput;
  error?: boolean;
}

/** A description of the run_code tool for options: the stateful one when it keeps state. */
export function describe(options: RunCodeOptions): string {
  return options.description ?? (options.session || options.context ? STATEFUL_DESCRIPTION : DEFAULT_DESCRIPTION);
}

/**
 * Runs one call of a run_code tool and gives its answer: the value and
 * figures as the model should see them. A refusal (a task the server
 * refuses, past a quota, a session that is busy) is the answer's text
 * with error set; what the model cannot act on (no server, a bug) throws.
 */
export async function runCodeAnswer(client: Client, input: RunCodeInput, options: RunCodeOptions = {}): Promise<RunCodeAnswer> {
  let r: Result;
  try {
    r = await client.run(task(input, options));
  } catch (e) {
    return { text: refusalText(options.name ?? DEFAULT_NAME, e), figures: [], error: true };
  }
  return answer(r);
}

/** Runs one call of a run_code tool. A refusal throws AgentrunError, which the framework reports. */
export async function runCode(client: Client, input: RunCodeInput, options: RunCodeOptions = {}): Promise<RunCodeOutput> {
  return output(await client.run(task(input, options)));
}

/** The task of a call: the options' fields, the model's input, and the session whose state it keeps. */
function task(input: RunCodeInput, options: RunCodeOptions): RunTask {
  const t: RunTask = { ...(options.task ?? {}), code: input.code };
  const language = input.language || options.language;
  if (language) t.language = language;
  if (input.files) t.files = { ...input.files };
  const session = options.context?.id ?? options.session;
  if (session) {
    t.session = session;
    t.keep_state = true;
    if (options.context?.tools && t.tools == null) t.tools = [...options.context.tools];
  }
  return t;
}

/**
 * The text a model reads for err, a tool's failed call: a refusal's
 * reason, the task field at fault and when to try again, never a stack.
 * An error that is not agentrun's refusal (no answer from the server, a
 * bug of the program) is thrown again: the program, not the model, has
 * to deal with it.
 */
export function refusalText(tool: string, err: unknown): string {
  if (!(err instanceof AgentrunError) || err instanceof TransportError) throw err;
  if (err.result) {
    return `${tool} failed: agentrun could not run it (${err.result.error || err.message}); trying again may work`;
  }
  let s = `${tool} refused`;
  if (err.status !== undefined) s += ` (${err.status})`;
  s += ": ";
  if (err.field) s += err.field + ": ";
  s += err.message;
  if (err.retryAfter !== undefined) s += ` (try again in ${err.retryAfter} s)`;
  return s;
}

/** The answer of a result: its text for the model, its figures, its fields. */
export function answer(r: Result): RunCodeAnswer {
  const figures: Figure[] = [];
  const parts: string[] = [];
  const section = (name: string, s: string, truncated: boolean, total?: number) => {
    if (!s && !truncated) return;
    let t = `${name}:\n${s}`;
    if (!t.endsWith("\n")) t += "\n";
    if (truncated) t += `[${name} truncated: ${Buffer.byteLength(s)} of ${total ?? "more"} bytes kept]\n`;
    parts.push(t);
  };
  section("stdout", r.stdout, r.stdout_truncated, r.stdout_bytes);
  section("stderr", r.stderr, r.stderr_truncated, r.stderr_bytes);
  parts.push(outcome(r) + "\n");
  (r.display ?? []).forEach((b, i) => parts.push(...bundle(`display ${i + 1}`, b, figures)));
  if (r.display_dropped) parts.push(`[${r.display_dropped} displayed object(s) left out: past the output cap or 16]\n`);
  if (r.value) parts.push(...bundle("value", r.value, figures));
  if (r.state) {
    const st = r.state;
    let t = st.saved ? `[state kept: ${(st.kept ?? []).join(", ") || "nothing"}` : `[state not kept (${st.reason || "no reason given"}): the previous one stays`;
    const dropped = Object.entries(st.dropped ?? {});
    if (dropped.length) t += `; left out: ${dropped.map(([k, v]) => `${k} (${v})`).join(", ")}`;
    parts.push(t + "]\n");
  }
  return { text: parts.join("").replace(/\n$/, ""), figures, output: output(r) };
}

/**
 * A bundle's parts for the model, called what: text/plain (else another
 * text form) cut to MAX_TEXT, text/html cut to MAX_HTML, and its images
 * added to figures. A figure's text/plain ("<Figure size ...>") is left
 * out when the image is there.
 */
function bundle(what: string, b: Record<string, string>, figures: Figure[]): string[] {
  const parts: string[] = [];
  let image = false;
  for (const mime of ["image/png", "image/jpeg"] as const) {
    if (b[mime]) {
      figures.push({ mimeType: mime, data: b[mime] });
      parts.push(`[${what}: ${mime} image ${figures.length}]\n`);
      image = true;
      break;
    }
  }
  if (!image || what === "value") {
    const plain = ["text/plain", "text/markdown", "text/latex", "application/json", "image/svg+xml"].find((m) => b[m] !== undefined);
    if (plain) parts.push(cut(`${what} (${plain})`, b[plain], MAX_TEXT));
  }
  if (b["text/html"] !== undefined) parts.push(cut(`${what} (text/html)`, b["text/html"], MAX_HTML));
  return parts;
}

/** "what:\ntext", cut to max characters with the cut said. */
function cut(what: string, text: string, max: number): string {
  let t = text.length > max ? text.slice(0, max) : text;
  if (!t.endsWith("\n")) t += "\n";
  if (text.length > max) t += `[${what} cut: ${max} of ${text.length} characters kept]\n`;
  return `${what}:\n${t}`;
}

/** The one line on how the run ended, in the words of MCP's run_code (internal/mcpserver's outcome). */
function outcome(r: Result): string {
  const how = r.timed_out ? "timed out: killed at its time limit"
    : r.oom_killed ? "killed: out of memory (OOM)"
    : r.signal ? `killed by ${r.signal}` : `exit code ${r.exit_code}`;
  const parts = [how, `${r.duration_ms} ms`];
  if (r.network?.none) parts.push("no network");
  const cutOut = [r.stdout_truncated && "stdout", r.stderr_truncated && "stderr"].filter(Boolean);
  if (cutOut.length) parts.push(cutOut.join(" and ") + " truncated");
  for (const d of r.network?.denied ?? []) parts.push(`network: ${d.host}:${d.port} refused (${d.reason})`);
  return `[${parts.join(", ")}; run ${r.id}]`;
}

function output(r: Result): RunCodeOutput {
  const o: RunCodeOutput = {
    exit_code: r.exit_code, stdout: r.stdout, stderr: r.stderr, timed_out: r.timed_out, oom_killed: r.oom_killed,
    stdout_truncated: r.stdout_truncated, stderr_truncated: r.stderr_truncated, duration_ms: r.duration_ms,
  };
  if (r.value?.["text/plain"] !== undefined) o.value = r.value["text/plain"];
  if (r.state) o.state = r.state;
  return o;
}
