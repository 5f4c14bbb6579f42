// Writes src/task.ts from serve's OpenAPI document: the names of
// task.json's fields (the Task schema's properties), and the JSON Schema of
// the run_code tools' input, task.json's code, language and files, as the
// document types them (files as text: the map of TaskFile's `content`).
// `npm run openapi` runs it after openapi-typescript; a test runs it again
// and fails when the committed file differs.
//
//     node scripts/task.mjs [openapi.json [out.ts]]

import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const [docPath = join(root, "..", "..", "internal", "server", "openapi.json"), out = join(root, "src", "task.ts")] =
  process.argv.slice(2);

/** The fields a run_code tool takes from the model, in the order the model is shown them. */
const RUN_CODE = ["code", "language", "files"];
/** Those the model must give. */
const REQUIRED = ["code"];

const doc = JSON.parse(readFileSync(docPath, "utf8"));
const schemas = doc.components.schemas;
const task = schemas.Task.properties;

/** The schema at a "#/components/schemas/NAME" reference, or s itself. */
function resolve(s) {
  const ref = s?.$ref;
  if (ref === undefined) return s;
  const m = /^#\/components\/schemas\/([^/]+)$/.exec(ref);
  if (!m || !schemas[m[1]]) throw new Error(`${docPath}: $ref ${ref}: not a schema of components.schemas`);
  return schemas[m[1]];
}

/** A type of the document without "null": a run_code field the model leaves out is absent, not null. */
function type(s, where) {
  const types = [s?.type].flat().filter((t) => t !== "null");
  if (types.length !== 1) throw new Error(`${docPath}: ${where}: type ${JSON.stringify(s?.type)}, want one type`);
  return types[0];
}

/** The run_code schema of task.json's field name: text, or a map of names to text. */
function field(name) {
  const s = resolve(task[name]);
  if (!s) throw new Error(`${docPath}: Task has no property ${name}`);
  const t = type(s, `Task.${name}`);
  if (t === "string") return { type: "string" };
  const content = resolve(s.additionalProperties)?.properties?.content;
  if (t === "object" && type(content, `Task.${name}'s content`) === "string") {
    return { type: "object", additionalProperties: { type: "string" } };
  }
  throw new Error(`${docPath}: Task.${name}: a run_code tool takes text or a map of names to text`);
}

const input = {
  type: "object",
  properties: Object.fromEntries(RUN_CODE.map((name) => [name, field(name)])),
  required: REQUIRED,
};

writeFileSync(out, `// Generated from internal/server/openapi.json by scripts/task.mjs (npm run openapi): do not edit.

/** The fields of task.json: the properties of the document's Task. */
export const TASK_PROPERTIES = ${JSON.stringify(Object.keys(task), null, 2)} as const;

/**
 * The JSON Schema of a run_code tool's input: task.json's code, language
 * and files as the document types them, files as text.
 */
export const RUN_CODE_INPUT = ${JSON.stringify(input, null, 2)} as const;
`);
