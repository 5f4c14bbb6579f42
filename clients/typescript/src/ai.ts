/**
 * agentrun as a Vercel AI SDK tool (`ai`, a peer dependency): each call
 * runs the model's code in a fresh sandbox of agentrun serve.
 *
 *     import { Client } from "agentrun";
 *     import { runCodeTool } from "agentrun/ai";
 *     const tools = { run_code: runCodeTool(new Client()) };
 *
 * @module
 */

import { tool } from "ai";
import type { Client } from "./index.js";
import { DEFAULT_DESCRIPTION, runCode, runCodeInputSchema, type RunCodeOptions } from "./tool.js";

export type { RunCodeInput, RunCodeOptions, RunCodeOutput } from "./tool.js";

/** The tool's input: the model's program, its language and its files. */
export const runCodeInput = runCodeInputSchema("optional");

/**
 * An AI SDK tool that runs the model's code with client. options.task
 * holds the task fields every call gets (limits, network, image, ...).
 */
export function runCodeTool(client: Client, options: RunCodeOptions = {}) {
  return tool({
    description: options.description ?? DEFAULT_DESCRIPTION,
    inputSchema: runCodeInput,
    execute: async (input) => runCode(client, input, options),
  });
}
