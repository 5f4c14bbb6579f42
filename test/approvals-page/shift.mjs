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
import { base, hold, launch, routePage } from "./browser.mjs";

const first = hold("ap-innocent", "https://api.test/repos/me/sandbox/issues");
const second = hold("ap-harmful", "https://api.test/repos/org/prod/releases");
const state = { held: [first, second], decided: [] };

const browser = await launch();
const out = {};
try {
  const page = await browser.newPage({ viewport: { width: 390, height: 844 } });
  await routePage(page, state);
  await page.goto(base + "/ui/approvals");
  const firstYes = page.locator(`#held li[data-id="${first.id}"] button.approve`);
  await firstYes.waitFor();
  await page.waitForTimeout(1500); // both cards settled in place
  const box = await firstYes.boundingBox();
  // The first request goes; the second moves up to where it was.
  state.held = [second];
  await page.locator(`#held li[data-id="${first.id}"]`).waitFor({ state: "detached", timeout: 10000 });
  await page.mouse.click(box.x + box.width / 2, box.y + box.height / 2);
  await page.waitForTimeout(300);
  out.afterMove = state.decided.slice();
  // Settled, the second's own button works.
  await page.waitForTimeout(1200);
  try {
    await page.locator(`#held li[data-id="${second.id}"] button.approve`).click({ timeout: 5000 });
    await page.waitForTimeout(300);
  } catch (e) {
    out.error = String(e).split("\n")[0];
  }
  out.afterSettled = state.decided.slice();
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
