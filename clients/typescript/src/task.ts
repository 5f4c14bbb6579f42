// Generated from internal/server/openapi.json by scripts/task.mjs (npm run openapi): do not edit.

/** The fields of task.json: the properties of the document's Task. */
export const TASK_PROPERTIES = [
  "id",
  "session",
  "keep_workspace",
  "keep_state",
  "reset_state",
  "image",
  "language",
  "code",
  "command",
  "stdin",
  "files",
  "collect",
  "env",
  "limits",
  "network",
  "tools",
  "runtime"
] as const;

/**
 * The JSON Schema of a run_code tool's input: task.json's code, language
 * and files as the document types them, files as text.
 */
export const RUN_CODE_INPUT = {
  "type": "object",
  "properties": {
    "code": {
      "type": "string"
    },
    "language": {
      "type": "string"
    },
    "files": {
      "type": "object",
      "additionalProperties": {
        "type": "string"
      }
    }
  },
  "required": [
    "code"
  ]
} as const;
