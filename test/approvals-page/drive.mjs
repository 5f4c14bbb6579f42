// drive.mjs logs in on agentrun serve's approvals page in Debian's
// headless Chromium, checks that the held request carrying a hostile body
// shows it as inert text, approves one held request and denies another,
// and prints what it saw as JSON (test/integration
// TestApprovalsPageBrowser).
//
//   node drive.mjs BASE TOKEN APPROVE_ID DENY_ID HOSTILE_ID HOSTILE_TEXT
import { launch } from "./browser.mjs";

const [base, token, approveID, denyID, hostileID, hostileText] = process.argv.slice(2);
const browser = await launch();
const out = {};
try {
  const page = await browser.newPage({ viewport: { width: 390, height: 844 } }); // a phone's
  const dialogs = [];
  page.on("dialog", (d) => { dialogs.push(d.message()); d.dismiss(); });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));

  await page.goto(base + "/ui/approvals");
  await page.fill("#token", token);
  await Promise.all([page.waitForURL(base + "/ui/approvals"), page.click("button[type=submit]")]);

  for (const id of [approveID, denyID, hostileID]) {
    await page.waitForSelector(`#held li[data-id="${id}"]`, { timeout: 30000 });
  }
  const card = page.locator(`#held li[data-id="${hostileID}"]`);
  out.hostileShown = (await card.locator("code.program").allTextContents()).some((t) => t.includes(hostileText));
  out.pwned = await page.evaluate(() => window.__pwned);
  out.markupInList = await page.evaluate(() => document.querySelectorAll("#held img, #held script, #held iframe").length);
  out.cardText = await card.innerText();

  await page.locator(`#held li[data-id="${approveID}"] button.approve`).click();
  await page.locator(`#held li[data-id="${denyID}"] button.deny`).click();
  for (const id of [approveID, denyID]) {
    await page.waitForSelector(`#held li[data-id="${id}"]`, { state: "detached", timeout: 30000 });
  }
  await page.waitForFunction(() => document.querySelectorAll("#recent li").length >= 2, null, { timeout: 30000 });
  out.recent = await page.locator("#recent li").allTextContents();
  out.pwnedAfter = await page.evaluate(() => window.__pwned);
  out.dialogs = dialogs;
  out.errors = errors;
  out.cookieHttpOnly = (await page.context().cookies()).every((c) => c.httpOnly && c.sameSite === "Strict");
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
