/**
 * agentrun as a LangChain.js tool (`@langchain/core`, a peer
 * dependency): each call runs the model's code in a fresh sandbox of
 * agentrun serve and answers with the outcome as JSON.
 *
 *     import { Client } from "agentrun";
 *     import { runCodeTool } from "agentrun/langchain";
 *     const tools = [runCodeTool(new Client())];
 *
 * @module
 */

import { tool } from "@langchain/core/tools";
import type { z } from "zod";
import type { Client } from "./index.js";
import { DEFAULT_DESCRIPTION, DEFAULT_NAME, runCode, runCodeInputSchema, type RunCodeOptions } from "./tool.js";

export type { RunCodeInput, RunCodeOptions, RunCodeOutput } from "./tool.js";

/** The tool's input: the model's program, its language and its files. */
export const runCodeInput = runCodeInputSchema("optional");

/**
 * A LangChain tool that runs the model's code with client; its answer is
 * the outcome (exit_code, stdout, stderr, timed_out, ...) as JSON.
 */
export function runCodeTool(client: Client, options: RunCodeOptions = {}) {
  return tool(async (input: z.infer<typeof runCodeInput>) => JSON.stringify(await runCode(client, input, options)), {
    name: options.name ?? DEFAULT_NAME,
    description: options.description ?? DEFAULT_DESCRIPTION,
    schema: runCodeInput,
  });
}
