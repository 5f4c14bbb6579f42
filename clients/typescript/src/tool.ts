/**
 * What the adapters' run_code tools share: a call's input, the options a
 * program sets for every call, and the answer the model is given.
 *
 * @module
 */

import type { Client, Result, RunTask } from "./index.js";

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
