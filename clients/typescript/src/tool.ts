/**
 * What the adapters' run_code tools share: a call's input, the options a
 * program sets for every call, and the answer the model is given.
 *
 * @module
 */

import { z } from "zod";
import type { Client, Result, RunTask } from "./index.js";
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
  "Nothing outlives the call unless the sandbox's workspace is kept; the network is closed unless allowed.";

/** Runs one call of a run_code tool. A refusal throws AgentrunError, which the framework reports. */
export async function runCode(client: Client, input: RunCodeInput, options: RunCodeOptions = {}): Promise<RunCodeOutput> {
  const task: RunTask = { ...(options.task ?? {}), code: input.code };
  const language = input.language || options.language;
  if (language) task.language = language;
  if (input.files) task.files = { ...input.files };
  return output(await client.run(task));
}

function output(r: Result): RunCodeOutput {
  return {
    exit_code: r.exit_code, stdout: r.stdout, stderr: r.stderr, timed_out: r.timed_out, oom_killed: r.oom_killed,
    stdout_truncated: r.stdout_truncated, stderr_truncated: r.stderr_truncated, duration_ms: r.duration_ms,
  };
}
