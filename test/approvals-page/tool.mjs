// tool.mjs checks, in headless Chromium, how the approvals page shows a
// held tool call: its tool server, then its tool and arguments labelled
// as the program's, as inert text (a tool name and arguments that carry
// markup make no element and run no script), with no method, URL or body
// of a request; Approve decides it, and a last decision on a tool call
// names its tool and tool server. The page's files are served from the
// source tree with scripted JSON (browser.mjs's routePage). Prints what
// it saw as JSON (test/integration TestApprovalsPageToolCall).
//
//   node tool.mjs TOOL ARGUMENTS
import { base, launch, routePage } from "./browser.mjs";

const [tool, args] = process.argv.slice(2);
const held = { run: "ar-1", id: "ap-tool", kind: "tool", service: "github", tool, arguments: args,
  method: "", url: "", body_excerpt: "", body_cut: false, session: "", expires_at: "2030-01-01T00:00:00Z", left_ms: 60000 };
const recent = [{ ...held, approved: false, by: "timeout", at: "2030-01-01T00:00:00Z" }];
delete recent[0].left_ms;
const state = { held: [held], recent, decided: [] };

const browser = await launch();
const out = {};
try {
  const page = await browser.newPage({ viewport: { width: 390, height: 844 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await routePage(page, state);
  await page.goto(base + "/ui/approvals");
  const card = page.locator(`#held li[data-id="${held.id}"]`);
  await card.waitFor();
  out.labels = await card.locator(".label").allTextContents();
  out.program = await card.locator("code.program").allTextContents();
  out.values = await card.locator("span.value").allTextContents();
  out.markup = await page.evaluate(() => document.querySelectorAll("#held img, #held script, #held iframe, #recent img").length);
  out.pwned = await page.evaluate(() => window.__pwned === undefined ? null : window.__pwned);
  await page.locator("#recent li").first().waitFor();
  out.recent = await page.locator("#recent li").allTextContents();
  await page.waitForTimeout(1500); // the card settled in place
  await card.locator("button.approve").click({ timeout: 5000 });
  await card.waitFor({ state: "detached", timeout: 10000 });
  out.decided = state.decided.slice();
  out.errors = errors;
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
