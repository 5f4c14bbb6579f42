// Shared by the scripts that drive serve's E2B door with E2B's own SDKs
// (test/integration/e2b_test.go). The environment names serve and the key
// as an E2B user's would: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY.
//
// A script records what it saw with see(name, value) and, at its end,
// report() prints one JSON object {name: value, ...} as the last line of
// stdout, which the Go test checks. An error is recorded by its class
// name and message (caught(name, promise)).

const seen = {}

export function see(name, value) {
  seen[name] = value
}

// caught awaits p and records {ok: value} or {error: class, message}.
export async function caught(name, p) {
  try {
    const v = await p
    seen[name] = { ok: v === undefined ? null : v }
  } catch (e) {
    seen[name] = { error: e?.constructor?.name ?? String(e), message: String(e?.message ?? e) }
  }
  return seen[name]
}

export function report() {
  process.stdout.write(JSON.stringify(seen) + '\n')
}

// main runs fn, then reports; an uncaught error is reported as "fatal".
export async function main(fn) {
  try {
    await fn()
  } catch (e) {
    seen.fatal = { error: e?.constructor?.name ?? String(e), message: String(e?.stack ?? e) }
  }
  report()
}
