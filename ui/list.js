// /ui: every trajectory, live. The list is read once in full (pages of 500),
// then every second only what changed since the newest `updated_at` seen.
// Token and drift counts are in each summary (`num_tokens`, `drift_count`).
// Filters apply in the browser.
import { api, AuthError, el, show, onLeave, fmtReward, ago, fmtTime, showError } from "./app.js";

const POLL_MS = 1000;
const PAGE = 500;
const MAX_ROWS = 5000; // kept in memory

const rows = new Map(); // id -> meta
let newest = null; // largest updated_at seen (store clock, ms)

async function fetchChanged() {
  let cursor = null;
  const since = newest === null ? null : newest - 2000;
  for (let page = 0; page < MAX_ROWS / PAGE; page++) {
    const q = new URLSearchParams({ limit: String(PAGE) });
    if (since !== null) q.set("since", String(since));
    if (cursor) q.set("cursor", cursor);
    const body = await api(`/v1/trajectories?${q}`);
    for (const t of body.data) {
      rows.set(t.id, t);
      newest = Math.max(newest ?? 0, t.updated_at);
    }
    if (!body.has_more) break;
    cursor = body.next_cursor;
  }
}

function readFilters(form) {
  const f = new FormData(form);
  const num = (k) => (f.get(k) === "" || f.get(k) === null ? null : Number(f.get(k)));
  return {
    status: f.get("status") || "",
    group: (f.get("group") || "").trim(),
    min: num("min_reward"),
    max: num("max_reward"),
    drift: f.get("drift") || "",
  };
}

function matches(t, f) {
  if (f.status && t.status !== f.status) return false;
  if (f.group && !(t.group || "").includes(f.group)) return false;
  if (f.min !== null && !(t.reward !== null && t.reward !== undefined && t.reward >= f.min)) return false;
  if (f.max !== null && !(t.reward !== null && t.reward !== undefined && t.reward <= f.max)) return false;
  if (f.drift === "yes" && !(t.drift_count > 0)) return false;
  if (f.drift === "no" && t.drift_count !== 0) return false;
  return true;
}

function filterForm(onChange) {
  const form = el(
    "form", { id: "filters", class: "filters", role: "search" },
    el("label", {}, "Status ",
      el("select", { name: "status" },
        el("option", { value: "", text: "any" }),
        el("option", { value: "active", text: "active" }),
        el("option", { value: "finished", text: "finished" }))),
    el("label", {}, "Group ", el("input", { name: "group", type: "search", size: 12 })),
    el("label", {}, "Reward ≥ ", el("input", { name: "min_reward", type: "number", step: "any", size: 5 })),
    el("label", {}, "Reward ≤ ", el("input", { name: "max_reward", type: "number", step: "any", size: 5 })),
    el("label", {}, "Drift ",
      el("select", { name: "drift" },
        el("option", { value: "", text: "any" }),
        el("option", { value: "yes", text: "present" }),
        el("option", { value: "no", text: "none" }))),
  );
  form.addEventListener("input", onChange);
  form.addEventListener("submit", (e) => e.preventDefault());
  return form;
}

function row(t, now) {
  const href = `/ui/trajectories/${encodeURIComponent(t.id)}`;
  return el(
    "tr", { dataset: { id: t.id, status: t.status } },
    el("td", { class: "id" }, el("a", { href, text: t.id })),
    el("td", {}, el("span", { class: `status status-${t.status}`, text: t.status }),
      t.incomplete ? el("span", { class: "badge", title: "calls may be missing after a crash", text: "incomplete" }) : null),
    el("td", { text: t.group || "—" }),
    el("td", { class: "num", text: String(t.num_calls) }),
    el("td", { class: "num", text: String(t.num_tokens) }),
    el("td", { class: "num reward", text: fmtReward(t.reward) }),
    el("td", { class: `num${t.drift_count ? " has-drift" : ""}`, text: String(t.drift_count) }),
    el("td", { title: fmtTime(t.updated_at), text: ago(t.updated_at, now) }),
  );
}

export async function renderList() {
  const status = el("p", { class: "muted", id: "list-status", "aria-live": "polite" });
  const tbody = el("tbody");
  const table = el(
    "table", { id: "trajectories", class: "list" },
    el("caption", { class: "sr-only", text: "Trajectories, most recent activity first" }),
    el("thead", {}, el("tr", {},
      ...["id", "status", "group", "turns#", "tokens#", "reward#", "drift#", "last activity"]
        .map((h) => el("th", { scope: "col", class: h.endsWith("#") ? "num" : undefined, text: h.replace("#", "") })))),
    tbody,
  );
  const draw = () => {
    const f = readFilters(form);
    const now = Date.now();
    const shown = [...rows.values()]
      .filter((t) => matches(t, f))
      .sort((a, b) => b.updated_at - a.updated_at);
    const focused = document.activeElement?.closest?.("#trajectories tr")?.dataset.id;
    tbody.replaceChildren(...shown.map((t) => row(t, now)));
    if (focused) tbody.querySelector(`tr[data-id="${CSS.escape(focused)}"] a`)?.focus();
    status.textContent = `${shown.length} of ${rows.size} trajectories · live`;
  };
  const form = filterForm(draw);
  show(el("h1", { text: "Trajectories" }), form, status,
    el("div", { class: "table-wrap" }, table));

  let stopped = false;
  let timer = null;
  onLeave(() => {
    stopped = true;
    clearTimeout(timer);
  });
  const tick = async () => {
    try {
      await fetchChanged();
      draw();
    } catch (e) {
      stopped = true;
      showError(e);
      return;
    }
    if (!stopped) timer = setTimeout(tick, POLL_MS);
  };
  await tick();
}

// j / k move between rows, Enter opens (links are focusable too).
document.addEventListener("keydown", (e) => {
  if (e.target.closest("input, select, textarea")) return;
  const links = [...document.querySelectorAll("#trajectories tbody a")];
  if (!links.length || !["j", "k"].includes(e.key)) return;
  const i = links.indexOf(document.activeElement);
  const next = e.key === "j" ? Math.min(links.length - 1, i + 1) : Math.max(0, i - 1);
  links[next].focus();
  e.preventDefault();
});
