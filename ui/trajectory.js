// /ui/trajectories/{id}: metadata, reward, drift records, replay checks and,
// per sample, the token view (or the message view).
import { api, AuthError, el, show, fmtReward, fmtTime, NotFound } from "./app.js";
import { tokenStream, messageView, describe, policyOf } from "./tokens.js";

async function decodeAll(t) {
  const ids = new Set();
  for (const s of t.samples) for (const seg of s.segments) for (const id of seg.ids) ids.add(id);
  if (!ids.size) return {};
  try {
    const body = await api("/ui/api/decode", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ ids: [...ids] }),
    });
    return body.tokens || {};
  } catch (e) {
    if (e instanceof AuthError) throw e;
    return {}; // ids only

  }
}

function dl(pairs) {
  return el("dl", { class: "meta" }, ...pairs.filter(([, v]) => v !== undefined && v !== null && v !== "")
    .flatMap(([k, v, attrs]) => [el("dt", { text: k }), el("dd", attrs || {}, v instanceof Node ? v : String(v))]));
}

function json(v) {
  return el("pre", { class: "json", text: JSON.stringify(v, null, 2) });
}

function legend() {
  return el("p", { class: "legend" },
    el("span", { class: "tok sampled h0", text: "sampled" }), " ",
    el("span", { class: "tok prompt", text: "prompt" }), " ",
    el("span", { class: "tok observation", text: "observation" }), " · logprob: ",
    ...["h0", "h1", "h2", "h3", "h4", "h5"].map((h, i) => el("span", {
      class: `tok sampled ${h}`, text: ["≥ −0.1", "≥ −0.5", "≥ −1", "≥ −2", "≥ −4", "< −4"][i],
    })),
    " · ", el("span", { class: "drift-mark", text: "⚠ drift" }),
    " · keys: ← → token, [ ] call, d drift, m message view");
}

function replaySummary(r) {
  if (!r) return null;
  return el("section", { class: "replay" },
    el("h3", { text: "Replay check" }),
    dl([
      ["policy", r.adapter ?? r.model ?? null],
      ["backend", r.backend], ["checked", fmtTime(r.checked_at)], ["compared", r.compared],
      ["max |Δ|", r.max_abs_diff], ["mean |Δ|", r.mean_abs_diff], ["threshold", r.threshold],
      ["argmax mismatch", r.argmax_mismatch_share],
    ]),
    r.positions?.length ? el("table", { class: "list replay-positions" },
      el("thead", {}, el("tr", {}, ...["response position", "token", "recorded", "replayed", "|Δ|"]
        .map((h) => el("th", { scope: "col", text: h })))),
      el("tbody", {}, ...r.positions.map((p) => el("tr", {},
        el("td", { class: "num", text: p.position }), el("td", { class: "num", text: p.token_id }),
        el("td", { class: "num", text: p.recorded.toFixed(4) }),
        el("td", { class: "num", text: p.replayed.toFixed(4) }),
        el("td", { class: "num", text: Math.abs(p.recorded - p.replayed).toFixed(4) }))))) : null);
}

// Arrow keys walk the tokens of a stream; the inspector says where we are.
function navigable(stream, inspector) {
  const toks = () => [...stream.querySelectorAll(".tok")];
  let cur = -1;
  const go = (i) => {
    const all = toks();
    if (!all.length) return;
    all[cur]?.classList.remove("cur");
    cur = Math.max(0, Math.min(all.length - 1, i));
    all[cur].classList.add("cur");
    all[cur].scrollIntoView({ block: "nearest" });
    inspector.textContent = describe(all[cur]);
  };
  const jump = (test, dir) => {
    const all = toks();
    const from = all[cur];
    const idx = all.map((t, i) => (test(t, from) ? i : -1)).filter((i) => i >= 0);
    const next = dir > 0 ? idx.find((i) => i > cur) : idx.reverse().find((i) => i < cur);
    if (next !== undefined) go(next);
  };
  // First token of each call in the stream.
  const callStart = (t) => {
    const seg = t.closest(".seg");
    return seg?.previousElementSibling?.classList.contains("boundary") && seg.querySelector(".tok") === t;
  };
  const drift = (t) => t.classList.contains("drift");
  stream.addEventListener("keydown", (e) => {
    const keys = {
      ArrowRight: () => go(cur + 1), ArrowLeft: () => go(cur - 1),
      Home: () => go(0), End: () => go(toks().length - 1),
      "]": () => jump(callStart, 1), "[": () => jump(callStart, -1),
      d: () => jump(drift, 1), D: () => jump(drift, -1),
    };
    if (keys[e.key]) {
      keys[e.key]();
      e.preventDefault();
    }
  });
  stream.addEventListener("mouseover", (e) => {
    const t = e.target.closest(".tok");
    if (t) inspector.textContent = describe(t);
  });
  stream.addEventListener("focus", () => { if (cur < 0) go(0); });
}

function sampleSection(t, s, calls, texts) {
  const drifts = t.drift.filter((d) => s.calls.includes(d.call));
  const stream = el("div", {
    class: "tokens", tabindex: 0, role: "group", dataset: { sample: s.sample },
    "aria-label": `tokens of sample ${s.sample}; arrow keys move between tokens`,
  });
  stream.append(tokenStream(s, calls, drifts, texts));
  const inspector = el("p", { class: "inspector", "aria-live": "polite", text: "Hover or focus a token." });
  navigable(stream, inspector);
  const messages = messageView(s, calls);
  messages.hidden = true;
  const toggle = el("button", { type: "button", class: "toggle", "aria-pressed": "false", text: "Message view" });
  toggle.addEventListener("click", () => {
    const toMessages = messages.hidden;
    messages.hidden = !toMessages;
    stream.hidden = toMessages;
    inspector.hidden = toMessages;
    toggle.textContent = toMessages ? "Token view" : "Message view";
    toggle.setAttribute("aria-pressed", String(toMessages));
  });
  const sampled = s.response_mask.filter((m) => m === 1).length;
  const policies = [...new Set(s.calls.map((c) => policyOf(calls.get(c))).filter((p) => p))];
  return el("section", { class: "sample", dataset: { sample: s.sample } },
    el("h2", {}, `Sample ${s.sample} `, toggle),
    dl([
      ["reward", fmtReward(s.reward), { class: "reward", dataset: { reward: s.reward ?? "" } }],
      ["turns", s.num_turns], ["calls", s.calls.join(", ")],
      ["policies", policies.length ? policies.join(", ") : null, { class: "policies" }],
      ["tokens", `${s.prompt_ids.length} prompt + ${s.response_ids.length} response (${sampled} sampled)`],
      ["finish reason", s.finish_reason], ["truncated", s.truncated ? "yes" : "no"],
      ["drift", drifts.length ? drifts.map((d) => `call ${d.call} at ${d.position}: ${d.cause}`).join("; ") : "none"],
    ]),
    ...(s.replays || (s.replay ? [s.replay] : [])).map(replaySummary),
    stream, inspector, messages);
}

export async function renderTrajectory(id) {
  let t;
  try {
    t = await api(`/v1/trajectories/${encodeURIComponent(id)}`);
  } catch (e) {
    if (!(e instanceof NotFound)) throw e;
    document.title = "tito · not found";
    show(el("h1", { text: "Trajectory not found" }),
      el("p", { class: "error not-found", role: "alert", id: "error" },
        "No trajectory with id ", el("code", { text: id }), " in this gateway's store. ",
        el("a", { href: "/ui", text: "Back to the list" }), "."));
    return;
  }
  document.title = `tito · ${t.id}`;
  const texts = await decodeAll(t);
  const calls = new Map(t.calls.map((c) => [c.call_index, c]));
  const extra = [];
  if (t.reward_extra) extra.push(el("h3", { text: "Reward parts" }), json(t.reward_extra));
  if (t.extra_info) extra.push(el("h3", { text: "extra_info" }), json(t.extra_info));
  show(
    el("p", {}, el("a", { href: "/ui", text: "← all trajectories" })),
    el("h1", {}, "Trajectory ", el("code", { text: t.id })),
    dl([
      ["status", t.status], ["reward", fmtReward(t.reward), { id: "reward", class: "reward", dataset: { reward: t.reward ?? "" } }],
      ["group", t.group], ["data source", t.data_source], ["index", t.index],
      ["calls", t.num_calls], ["samples", t.samples.length], ["drift records", t.drift.length],
      ["incomplete", t.incomplete ? "yes: calls may be missing after a crash" : null],
      ["created", fmtTime(t.created_at)], ["last activity", fmtTime(t.updated_at)],
    ]),
    ...extra,
    legend(),
    ...t.samples.map((s) => sampleSection(t, s, calls, texts)),
  );
}

// m toggles the focused sample between token and message view.
document.addEventListener("keydown", (e) => {
  if (e.key !== "m" || e.target.closest("input, select, textarea")) return;
  const section = e.target.closest(".sample") || document.querySelector(".sample");
  section?.querySelector(".toggle")?.click();
});
