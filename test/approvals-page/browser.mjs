// browser.mjs starts Debian's headless Chromium for the page's scripts
// (drive.mjs, shift.mjs).
import { chromium } from "playwright-core";

export function launch() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    // --no-sandbox: Chromium refuses to start its own sandbox as root,
    // which the integration suite runs as. The page under test is served
    // on loopback (or by Playwright's routing); the other flags keep
    // Chromium from connecting anywhere else. Playwright gives it a fresh
    // profile of its own, removed at close.
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
}
