// shift.mjs checks, in headless Chromium, that a click on the approvals
// page never lands on a card that has just moved under the pointer: two
// requests are held, the first goes (its program abandoned it), and a
// click where the first's Approve button was must not approve the second,
// which moved up there; once the second has stayed in place a second,
// its own buttons work. The page's files are served from the source tree
// (internal/server/ui) and its JSON is scripted through Playwright's
// routing: no server, no network. Prints what was decided as JSON
// (test/integration TestApprovalsPageNoClickOnAMovedCard).
//
//   node shift.mjs
import { launch } from "./browser.mjs";
import { readFileSync } from "node:fs";

const ui = new URL("../../internal/server/ui/", import.meta.url);
const file = (name) => readFileSync(new URL(name, ui), "utf8");
const base = "http://approvals.invalid";
const hold = (id, url) => ({ run: "ar-1", id, service: "api", method: "POST", url, body_excerpt: "x", body_cut: false, session: "", expires_at: "2030-01-01T00:00:00Z", left_ms: 60000 });
const first = hold("ap-innocent", "https://api.test/repos/me/sandbox/issues");
const second = hold("ap-harmful", "https://api.test/repos/org/prod/releases");
let held = [first, second];
const decided = [];

const browser = await launch();
const out = {};
try {
  const page = await browser.newPage({ viewport: { width: 390, height: 844 } });
  await page.route(base + "/**", async (route) => {
    const req = route.request();
    const path = new URL(req.url()).pathname;
    const csp = { "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'none'" };
    switch (path) {
      case "/ui/approvals":
        return route.fulfill({ contentType: "text/html; charset=utf-8", headers: csp, body: file("approvals.html").replace("{{.CSRF}}", "c") });
      case "/ui/approvals.js":
        return route.fulfill({ contentType: "text/javascript", body: file("approvals.js") });
      case "/ui/approvals.css":
        return route.fulfill({ contentType: "text/css", body: file("approvals.css") });
      case "/ui/approvals.json":
        return route.fulfill({ contentType: "application/json", body: JSON.stringify({ held, recent: [] }) });
      case "/ui/decide": {
        const f = new URLSearchParams(req.postData());
        decided.push(f.get("id") + " " + f.get("approve"));
        held = held.filter((h) => h.id !== f.get("id"));
        return route.fulfill({ contentType: "application/json", body: "{}" });
      }
    }
    return route.fulfill({ status: 404, body: "" });
  });
  await page.goto(base + "/ui/approvals");
  const firstYes = page.locator(`#held li[data-id="${first.id}"] button.approve`);
  await firstYes.waitFor();
  await page.waitForTimeout(1500); // both cards settled in place
  const box = await firstYes.boundingBox();
  // The first request goes; the second moves up to where it was.
  held = [second];
  await page.locator(`#held li[data-id="${first.id}"]`).waitFor({ state: "detached", timeout: 10000 });
  await page.mouse.click(box.x + box.width / 2, box.y + box.height / 2);
  await page.waitForTimeout(300);
  out.afterMove = decided.slice();
  // Settled, the second's own button works.
  await page.waitForTimeout(1200);
  try {
    await page.locator(`#held li[data-id="${second.id}"] button.approve`).click({ timeout: 5000 });
    await page.waitForTimeout(300);
  } catch (e) {
    out.error = String(e).split("\n")[0];
  }
  out.afterSettled = decided.slice();
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
