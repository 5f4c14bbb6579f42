// The approvals page: lists the held requests from /ui/approvals.json
// every 1.5 s (a held tool call, kind "tool", with its tool server, tool
// and arguments instead of a method, URL and body) and posts Approve or
// Deny to /ui/decide with the session's CSRF token. Every value from
// the server is set as textContent, never as
// markup: the program's text stays text.
"use strict";
(function () {
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const held = document.getElementById("held");
  const recent = document.getElementById("recent");
  const status = document.getElementById("status");
  const busy = new Set(); // run/id being decided
  const cards = new Map(); // run/id -> its li, kept across refreshes
  // A card's buttons work once it has stayed in its place this long: when
  // a card above goes (the program can abandon a request whenever it
  // likes) or one comes in above, the cards below move, and a click meant
  // for the card that was there must not land on the one that moved in.
  const settleMs = 1000;

  function buttonsOf(li) {
    return li.querySelectorAll(".buttons button");
  }

  function settle(li, key) {
    li.settledAt = Date.now() + settleMs;
    buttonsOf(li).forEach((b) => (b.disabled = true));
    setTimeout(() => {
      if (Date.now() >= li.settledAt && !busy.has(key)) buttonsOf(li).forEach((b) => (b.disabled = false));
    }, settleMs);
  }

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function field(li, label, value, program) {
    li.appendChild(el("span", "label", label));
    li.appendChild(el(program ? "code" : "span", program ? "program" : "value", value));
  }

  function left(ms) {
    const s = Math.ceil(ms / 1000);
    return s >= 60 ? Math.floor(s / 60) + " min " + (s % 60) + " s left" : s + " s left";
  }

  async function decide(h, approve, buttons) {
    const key = h.run + "/" + h.id;
    busy.add(key);
    buttons.forEach((b) => (b.disabled = true));
    try {
      const r = await fetch("/ui/decide", {
        method: "POST", credentials: "same-origin", cache: "no-store",
        headers: { "X-CSRF-Token": csrf },
        body: new URLSearchParams({ run: h.run, id: h.id, approve: String(approve) }),
      });
      if (!r.ok) {
        const j = await r.json().catch(() => ({}));
        status.textContent = "Not decided: " + (j.error || r.status);
      }
    } catch (e) {
      status.textContent = "Not decided: " + e;
    }
    busy.delete(key);
    if (Date.now() >= (buttons[0].closest("li").settledAt || 0)) buttons.forEach((b) => (b.disabled = false));
    refresh();
  }

  function card(h) {
    const li = el("li");
    li.dataset.id = h.id;
    li.appendChild(el("span", "left"));
    if (h.kind === "tool") {
      li.classList.add("tool");
      field(li, "Tool call to tool server", h.service, false);
      field(li, "Tool (the program's)", h.tool, true);
      field(li, "Arguments, whole (the program's)", h.arguments === "" ? "(none)" : h.arguments, true);
    } else {
      field(li, "Service", h.service, false);
      field(li, "Method (the program's)", h.method, true);
      field(li, "URL (the program's)", h.url, true);
      if (h.body_cut) {
        field(li, "Body, its start only: the rest is not shown (the program's)", h.body_excerpt, true);
      } else {
        field(li, "Body, whole (the program's)", h.body_excerpt === "" ? "(empty)" : h.body_excerpt, true);
      }
    }
    field(li, "Run", h.run, false);
    if (h.session) field(li, "Session", h.session, false);
    const box = el("div", "buttons");
    const yes = el("button", "approve", "Approve");
    const no = el("button", "deny", "Deny");
    yes.type = no.type = "button";
    if (busy.has(h.run + "/" + h.id)) yes.disabled = no.disabled = true;
    yes.addEventListener("click", () => decide(h, true, [yes, no]));
    no.addEventListener("click", () => decide(h, false, [yes, no]));
    box.append(yes, no);
    li.appendChild(box);
    return li;
  }

  function line(d) {
    const what = d.approved ? "approved" : "denied";
    const asked = d.kind === "tool" ? "tool " + d.tool + " of " + d.service : d.method + " " + d.url;
    return el("li", null, d.at + ": " + what + " by " + d.by + ": " + asked + " (run " + d.run + ")");
  }

  async function refresh() {
    let j;
    try {
      const r = await fetch("/ui/approvals.json", { credentials: "same-origin", cache: "no-store" });
      if (r.status === 401) {
        location.reload();
        return;
      }
      j = await r.json();
    } catch (e) {
      status.textContent = "Cannot reach the server: " + e;
      return;
    }
    const seen = new Map();
    j.held.forEach((h, i) => {
      const key = h.run + "/" + h.id;
      const li = cards.get(key) || card(h);
      li.querySelector(".left").textContent = left(h.left_ms);
      if (li.place !== i) {
        li.place = i;
        settle(li, key);
      }
      seen.set(key, li);
    });
    cards.clear();
    seen.forEach((li, key) => cards.set(key, li));
    held.replaceChildren(...seen.values());
    recent.replaceChildren(...j.recent.map(line));
    status.textContent = j.held.length === 0 ? "No request or tool call is held." : j.held.length + " held.";
  }

  refresh();
  setInterval(refresh, 1500);
})();
