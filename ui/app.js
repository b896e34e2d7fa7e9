// Entry point: the trainer token, API calls, small DOM helpers and the
// router (/ui -> list, /ui/trajectories/{id} -> trajectory).
import { renderList } from "./list.js";
import { renderTrajectory } from "./trajectory.js";

const TOKEN_KEY = "tito.trainer_token";

export class AuthError extends Error {}
export class NotFound extends Error {}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

// A link may carry the token in its fragment (#token=...): kept for this
// browser session and removed from the address bar (fragments never reach
// the server).
function takeTokenFromFragment() {
  const m = location.hash.match(/^#token=(.+)$/);
  if (m) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
}

// fetch() of the gateway's API with the trainer token; JSON back.
export async function api(path, options = {}) {
  const headers = { ...(options.headers || {}) };
  const t = token();
  if (t) headers.Authorization = `Bearer ${t}`;
  const resp = await fetch(path, { ...options, headers });
  if (resp.status === 401) throw new AuthError("this gateway needs a trainer token");
  let body = null;
  try {
    body = await resp.json();
  } catch {
    body = null;
  }
  if (resp.status === 404) throw new NotFound(body?.error?.message || "not found");
  if (!resp.ok) throw new Error(body?.error?.message || `HTTP ${resp.status}`);
  return body;
}

// el("div", {class: "x", dataset: {a: 1}}, child, "text", ...)
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "dataset") {
      for (const [dk, dv] of Object.entries(v)) {
        if (dv !== undefined && dv !== null) node.dataset[dk] = String(dv);
      }
    }
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : String(c));
  }
  return node;
}

export function fmtReward(r) {
  return r === null || r === undefined ? "—" : String(Math.round(r * 1e4) / 1e4);
}

export function fmtTime(ms) {
  return ms ? new Date(ms).toLocaleString() : "—";
}

export function ago(ms, now = Date.now()) {
  if (!ms) return "—";
  const s = Math.max(0, Math.round((now - ms) / 1000));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return `${Math.floor(s / 86400)} d ago`;
}

const main = () => document.getElementById("main");

// Replaces the page body; stops the previous view's timers.
let stopView = () => {};
export function show(...nodes) {
  main().replaceChildren(...nodes);
}
export function onLeave(fn) {
  stopView = fn;
}

export function showLogin(message) {
  stopView();
  stopView = () => {};
  const input = el("input", {
    id: "token", type: "password", name: "token", autocomplete: "current-password",
    required: true, "aria-describedby": "login-help",
  });
  const form = el(
    "form", { id: "login", class: "login" },
    el("h1", { text: "Trainer token needed" }),
    el("p", { id: "login-help", text: message ||
      "This gateway guards its trajectories with a trainer token ([auth] trainer_tokens). " +
      "It is kept in this browser tab only (sessionStorage)." }),
    el("label", { for: "token", text: "Trainer token" }),
    input,
    el("button", { type: "submit", text: "Open" }),
  );
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    route();
  });
  show(form);
  input.focus();
}

export function showError(err) {
  if (err instanceof AuthError) {
    showLogin(token() ? "That token was refused: try another." : undefined);
    return;
  }
  show(el("p", { class: "error", role: "alert", id: "error", text: String(err.message || err) }));
}

function route() {
  stopView();
  stopView = () => {};
  const logout = document.getElementById("logout");
  logout.hidden = !token();
  const m = location.pathname.match(/^\/ui\/trajectories\/([^/]+)\/?$/);
  const view = m ? renderTrajectory(decodeURIComponent(m[1])) : renderList();
  view.catch(showError);
}

function start() {
  takeTokenFromFragment();
  document.getElementById("logout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    route();
  });
  route();
}

start();
