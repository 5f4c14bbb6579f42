/**
 * agentrun as Vercel AI SDK tools (`ai` 6 or 7, a peer dependency):
 * run_code runs the model's code in a fresh sandbox of agentrun serve
 * for each call (with `session` or `context`, its Python globals carry
 * from call to call); shellTools gives it a shell in one live sandbox
 * instead (exec_command and write_stdin).
 *
 *     import { Client } from "agentrun";
 *     import { runCodeTool, shellTools } from "agentrun/ai";
 *     const tools = { run_code: runCodeTool(new Client()) };
 *
 * The model reads the output, how the run ended, a final expression's
 * value (text/plain, text/html cut to a bound) and the run's figures as
 * images (toModelOutput); a refusal as text, with the task field at
 * fault.
 *
 * @module
 */

import { createRequire } from "node:module";
import { tool } from "ai";
import type { Client } from "./index.js";
import {
  EXEC_DESCRIPTION, Shell, stdinDescription, shellInputSchemas, type ShellOptions, type ShellOutput,
} from "./shell.js";
import { describe, runCodeAnswer, runCodeInputSchema, type RunCodeAnswer, type RunCodeOptions } from "./tool.js";

export type { RunCodeAnswer, RunCodeInput, RunCodeOptions, RunCodeOutput, Figure } from "./tool.js";
export type { ShellOptions, ShellOutput } from "./shell.js";
export { Shell } from "./shell.js";

/** The tool's input: the model's program, its language and its files. */
export const runCodeInput = runCodeInputSchema("optional");

/**
 * The major version of the AI SDK installed beside agentrun: 7 takes an
 * image of a tool's result as a `file` part, 6 as `image-data` (which 7
 * still takes, with a warning).
 */
let aiMajor: number | undefined;
function aiVersion(): number {
  if (aiMajor === undefined) {
    try {
      aiMajor = Number(String((createRequire(import.meta.url)("ai/package.json") as { version?: string }).version).split(".")[0]) || 0;
    } catch {
      aiMajor = 0;
    }
  }
  return aiMajor;
}

/** What the model is given of an answer: its text, then each figure as an image part. */
function modelOutput(a: RunCodeAnswer | ShellOutput) {
  if (a.error) return { type: "error-text" as const, value: a.text };
  const figures = "figures" in a ? a.figures : [];
  if (!figures.length) return { type: "text" as const, value: a.text };
  const v7 = aiVersion() >= 7;
  return {
    type: "content" as const,
    value: [
      { type: "text" as const, text: a.text },
      ...figures.map((f) => (v7
        ? { type: "file" as const, mediaType: f.mimeType, data: { type: "data" as const, data: f.data } }
        : { type: "image-data" as const, data: f.data, mediaType: f.mimeType })),
    ],
  };
}

/**
 * An AI SDK tool that runs the model's code with client. options.task
 * holds the task fields every call gets (limits, network, image, ...);
 * options.session or options.context makes it stateful. Its execute
 * answers a {@link RunCodeAnswer}: `output` the result's fields, `text`
 * and `figures` what the model reads (toModelOutput).
 */
export function runCodeTool(client: Client, options: RunCodeOptions = {}) {
  return tool({
    description: describe(options),
    inputSchema: runCodeInput,
    execute: async (input) => runCodeAnswer(client, input, options),
    toModelOutput: ({ output }) => modelOutput(output),
  });
}

/**
 * exec_command and write_stdin, Codex's pair, in one live sandbox: the
 * one options.sandbox gives (the caller ends it), else one made at the
 * first call (options.create its request) and ended by `shell.close()`.
 *
 *     await using shell = shellTools(c);
 *     await generateText({ model, tools: shell.tools, prompt });
 */
export function shellTools(client: Client, options: ShellOptions = {}) {
  const shell = new Shell(client, options);
  const schemas = shellInputSchemas("optional");
  const tools = {
    exec_command: tool({
      description: EXEC_DESCRIPTION,
      inputSchema: schemas.exec,
      execute: async (input) => shell.exec(input),
      toModelOutput: ({ output }) => modelOutput(output),
    }),
    write_stdin: tool({
      description: stdinDescription(Boolean(options.tty)),
      inputSchema: schemas.stdin,
      execute: async (input) => shell.writeStdin(input),
      toModelOutput: ({ output }) => modelOutput(output),
    }),
  };
  return {
    tools,
    shell,
    close: () => shell.close(),
    [Symbol.asyncDispose]: () => shell.close(),
  };
}
