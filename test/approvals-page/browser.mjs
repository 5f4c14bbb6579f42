// browser.mjs starts Debian's headless Chromium for the page's scripts
// (drive.mjs, shift.mjs).
import { chromium } from "playwright-core";
import { readFileSync } from "node:fs";

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

const ui = new URL("../../internal/server/ui/", import.meta.url);
const file = (name) => readFileSync(new URL(name, ui), "utf8");

// base is where routePage serves the approvals page.
export const base = "http://approvals.invalid";

// hold is a held request as /ui/approvals.json lists it.
export function hold(id, url, body = "x") {
  return { run: "ar-1", id, service: "api", method: "POST", url, body_excerpt: body, body_cut: false,
    session: "", expires_at: "2030-01-01T00:00:00Z", left_ms: 60000 };
}

// routePage serves the page's own files from the source tree
// (internal/server/ui) to page at base, through Playwright's routing (no
// server, no network): /ui/approvals.json lists state.held (and
// state.recent, the last decisions, when given), and
// /ui/decide appends "ID true|false" to state.decided and takes the
// request off state.held.
export async function routePage(page, state) {
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
        return route.fulfill({ contentType: "application/json", body: JSON.stringify({ held: state.held, recent: state.recent || [] }) });
      case "/ui/decide": {
        const f = new URLSearchParams(req.postData());
        state.decided.push(f.get("id") + " " + f.get("approve"));
        state.held = state.held.filter((h) => h.id !== f.get("id"));
        return route.fulfill({ contentType: "application/json", body: "{}" });
      }
    }
    return route.fulfill({ status: 404, body: "" });
  });
}
