/**
 * agentrun as LangChain.js tools (`@langchain/core`, a peer
 * dependency): run_code runs the model's code in a fresh sandbox of
 * agentrun serve for each call (with `session` or `context`, its Python
 * globals carry from call to call); shellTools gives it a shell in one
 * live sandbox instead (exec_command and write_stdin).
 *
 *     import { Client } from "agentrun";
 *     import { runCodeTool } from "agentrun/langchain";
 *     const tools = [runCodeTool(new Client())];
 *
 * A tool's answer is content blocks: a text block (the output, how the
 * run ended, a final expression's value, text/html cut to a bound) and
 * an image block for each figure; the result's fields are the
 * ToolMessage's artifact. A refusal is a text block with the task field
 * at fault.
 *
 * @module
 */

import { tool } from "@langchain/core/tools";
import type { z } from "zod";
import type { Client } from "./index.js";
import {
  EXEC_DESCRIPTION, EXEC_TOOL, STDIN_TOOL, Shell, stdinDescription, shellInputSchemas, type ShellOptions, type ShellOutput,
} from "./shell.js";
import { DEFAULT_NAME, describe, runCodeAnswer, runCodeInputSchema, type RunCodeAnswer, type RunCodeOptions } from "./tool.js";

export type { RunCodeAnswer, RunCodeInput, RunCodeOptions, RunCodeOutput, Figure } from "./tool.js";
export type { ShellOptions, ShellOutput } from "./shell.js";
export { Shell } from "./shell.js";

/** The tool's input: the model's program, its language and its files. */
export const runCodeInput = runCodeInputSchema("optional");

/** A content block of a tool's answer: text, or an image (LangChain's standard blocks). */
export type ContentBlock = { type: "text"; text: string } | { type: "image"; mimeType: string; data: string };

/** An answer as content blocks and the artifact (the fields the program reads: output, or the shell's). */
function blocks(a: RunCodeAnswer | ShellOutput): [ContentBlock[], unknown] {
  const content: ContentBlock[] = [{ type: "text", text: a.text }];
  if ("figures" in a) {
    for (const f of a.figures) content.push({ type: "image", mimeType: f.mimeType, data: f.data });
    return [content, a.error ? { error: a.text } : a.output];
  }
  const { text: _text, ...fields } = a;
  return [content, fields];
}

/**
 * A LangChain tool that runs the model's code with client. options.task
 * holds the task fields every call gets; options.session or
 * options.context makes it stateful. Invoked with a tool call, it
 * answers a ToolMessage whose content is the blocks and whose artifact
 * is the result's fields (exit_code, stdout, stderr, value, state, ...);
 * invoked with bare input, the blocks.
 */
export function runCodeTool(client: Client, options: RunCodeOptions = {}) {
  return tool(async (input: z.infer<typeof runCodeInput>) => blocks(await runCodeAnswer(client, input, options)), {
    name: options.name ?? DEFAULT_NAME,
    description: describe(options),
    schema: runCodeInput,
    responseFormat: "content_and_artifact",
  });
}

/**
 * exec_command and write_stdin, Codex's pair, in one live sandbox: the
 * one options.sandbox gives (the caller ends it), else one made at the
 * first call (options.create its request) and ended by `close()`.
 *
 *     await using shell = shellTools(c);
 *     const agent = createAgent({ model, tools: shell.tools });
 */
export function shellTools(client: Client, options: ShellOptions = {}) {
  const shell = new Shell(client, options);
  const schemas = shellInputSchemas("optional");
  const tools = [
    tool(async (input: z.infer<typeof schemas.exec>) => blocks(await shell.exec(input)), {
      name: EXEC_TOOL,
      description: EXEC_DESCRIPTION,
      schema: schemas.exec,
      responseFormat: "content_and_artifact",
    }),
    tool(async (input: z.infer<typeof schemas.stdin>) => blocks(await shell.writeStdin(input)), {
      name: STDIN_TOOL,
      description: stdinDescription(Boolean(options.tty)),
      schema: schemas.stdin,
      responseFormat: "content_and_artifact",
    }),
  ] as const;
  return {
    tools,
    shell,
    close: () => shell.close(),
    [Symbol.asyncDispose]: () => shell.close(),
  };
}
