// The authlimit status page. It asks the admin API with the token the
// user entered, kept in sessionStorage (this tab only), and shows
// everything as text: key tags and paths come from clients.
"use strict";

const TOKEN = "authlimit-admin-token";
const TOP_N = 10;
const POLL_MS = 5000;
const peeks = new Map(); // rule + "\n" + tag -> text shown beside the entry
let timer = null;

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

async function api(method, path) {
  const token = sessionStorage.getItem(TOKEN);
  const res = await fetch(path, { method, headers: { Authorization: "Bearer " + token }, cache: "no-store" });
  if (res.status === 401) {
    signOut("The token was refused.");
    throw new Error("unauthorized");
  }
  const body = await res.json();
  if (!res.ok) throw new Error(body.error || res.statusText);
  return body;
}

function signOut(why) {
  sessionStorage.removeItem(TOKEN);
  clearTimeout(timer);
  document.getElementById("status").hidden = true;
  document.getElementById("signout").hidden = true;
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = why || "";
}

function rate(xs) {
  return xs && xs.length ? xs[xs.length - 1] : 0;
}

function fmt(x) {
  return x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2);
}

// sparkline draws the admitted and denied rates, one point a step.
function sparkline(r) {
  const w = 240, h = 40, ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("width", w);
  svg.setAttribute("height", h);
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", "admitted and denied requests a second, last minutes");
  const adm = (r && r.admitted) || [], den = (r && r.denied) || [];
  const top = Math.max(1, ...adm, ...den);
  for (const [cls, xs] of [["admitted", adm], ["denied", den]]) {
    if (xs.length === 0) continue;
    const step = xs.length > 1 ? w / (xs.length - 1) : w;
    const pts = xs.map((x, i) => `${(i * step).toFixed(1)},${(h - 2 - (x / top) * (h - 4)).toFixed(1)}`);
    if (xs.length === 1) pts.push(`${w},${pts[0].split(",")[1]}`);
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("class", cls);
    line.setAttribute("points", pts.join(" "));
    svg.append(line);
  }
  return svg;
}

function topTable(rule, ans) {
  const cur = ans.current;
  const note = cur.exact ? "exact" : `estimates: each count over by at most ${cur.error_bound}`;
  const caption = el("p", { class: "muted" },
    `Top limited, window since ${new Date(cur.start).toLocaleTimeString()} (${cur.replicas} replica${cur.replicas === 1 ? "" : "s"}, ${note})`);
  if (cur.entries.length === 0) return el("div", {}, caption, el("p", { class: "muted empty" }, "No client limited in this window."));
  const body = el("tbody");
  for (const e of cur.entries) {
    const key = rule + "\n" + e.tag;
    const out = el("td", { class: "peek" }, peeks.get(key) || "");
    const peek = el("button", { type: "button", class: "peek-button", onclick: async () => {
      try {
        const q = await api("GET", `/v1/quota?rule=${encodeURIComponent(rule)}&tag=${encodeURIComponent(e.tag)}`);
        const s = q.rules.map(x => `${x.remaining} of ${x.limit} left`).join("; ");
        peeks.set(key, s);
        out.textContent = s;
      } catch (err) { out.textContent = "peek failed: " + err.message; }
    } }, "Peek");
    const reset = el("button", { type: "button", class: "reset-button", onclick: async () => {
      try {
        await api("DELETE", `/v1/quota?rule=${encodeURIComponent(rule)}&tag=${encodeURIComponent(e.tag)}`);
        const q = await api("GET", `/v1/quota?rule=${encodeURIComponent(rule)}&tag=${encodeURIComponent(e.tag)}`);
        const s = "reset: " + q.rules.map(x => `${x.remaining} of ${x.limit} left`).join("; ");
        peeks.set(key, s);
        out.textContent = s;
      } catch (err) { out.textContent = "reset failed: " + err.message; }
    } }, "Reset");
    body.append(el("tr", { class: "entry" },
      el("td", { class: "tag" }, e.tag),
      el("td", { class: "client" }, e.client || ""),
      el("td", { class: "num denied" }, e.denied),
      el("td", { class: "num admitted" }, e.admitted),
      el("td", {}, new Date(e.last_seen).toLocaleTimeString()),
      el("td", {}, peek, " ", reset),
      out));
  }
  return el("div", {}, caption, el("table", { class: "top" },
    el("thead", {}, el("tr", {}, ...["Key", "Client", "Denied", "Admitted", "Last denied", "", "Quota"].map(x => el("th", {}, x)))),
    body));
}

async function refresh() {
  clearTimeout(timer);
  const error = document.getElementById("error");
  try {
    const st = await api("GET", "/v1/status");
    const hashes = Object.entries(st.hashes || {}).map(([k, v]) => `${k} ${v.slice(0, 12)}`).join(", ");
    document.getElementById("config").textContent =
      `configuration ${hashes}, loaded ${new Date(st.loaded_at).toLocaleString()}`;
    const circuits = document.querySelector("#circuits tbody");
    circuits.replaceChildren(...(st.circuits.length ? st.circuits.map(c =>
      el("tr", {}, el("td", {}, c.shard < 0 ? "all (not ready at start)" : c.shard), el("td", { class: "state-" + c.state }, c.state)))
      : [el("tr", {}, el("td", { colspan: 2, class: "muted" }, "the embedded memory store has no circuits"))]));
    const sections = [];
    for (const r of st.rules) {
      let top;
      try {
        top = topTable(r.rule, await api("GET", `/v1/top?rule=${encodeURIComponent(r.rule)}&n=${TOP_N}`));
      } catch (err) {
        top = el("p", { class: "error" }, "top limited clients: " + err.message);
      }
      const title = el("h3", {}, r.rule, r.shadow ? el("span", { class: "badge shadow" }, "shadow: would have denied") : null);
      sections.push(el("section", { class: "rule", "data-rule": r.rule },
        title,
        el("p", { class: "muted" }, r.limit || "a limit of Envoy's rate limit service"),
        el("div", { class: "rates" },
          sparkline(r.rates),
          el("span", { class: "legend-admitted" }, "admitted ", el("b", { class: "admitted-rate" }, fmt(rate(r.rates && r.rates.admitted))), "/s"),
          el("span", { class: "legend-denied" }, "denied ", el("b", { class: "denied-rate" }, fmt(rate(r.rates && r.rates.denied))), "/s")),
        top));
    }
    document.getElementById("rules").replaceChildren(...sections);
    error.textContent = "";
  } catch (err) {
    if (err.message === "unauthorized") return;
    error.textContent = "Could not reach authlimit: " + err.message;
  }
  timer = setTimeout(refresh, POLL_MS);
}

function start() {
  document.getElementById("login").hidden = true;
  document.getElementById("status").hidden = false;
  document.getElementById("signout").hidden = false;
  refresh();
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("login").addEventListener("submit", ev => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN, document.getElementById("token").value);
    document.getElementById("token").value = "";
    start();
  });
  document.getElementById("signout").addEventListener("click", () => signOut(""));
  if (sessionStorage.getItem(TOKEN)) start(); else signOut("");
});
