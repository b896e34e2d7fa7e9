// One sample's token sequence as spans: one <span class="tok"> per token
// with data-mask (1 sampled, 0 prompt/observation), data-token-id,
// data-logprob and data-pos (index into prompt_ids ++ response_ids); call
// boundaries, tool calls, tool results, drift records and replay
// differences marked where they sit. An image's run of `<|image_pad|>`
// tokens is one chip holding the image (data-pos its first position,
// data-count the run's length) instead of one span per token.
import { el, token } from "./app.js";

const IMAGE_PAD = "<|image_pad|>";

// The chip of the `n`-th image of a sample: the picture (read with the
// trainer token) and its size, grid and token count.
function imageChip(image, pos, count) {
  const img = el("img", { class: "image-thumb", alt: image ? `image ${image.sha256.slice(0, 12)}` : "image" });
  if (image) {
    const headers = token() ? { Authorization: `Bearer ${token()}` } : {};
    fetch(`/v1/images/${image.sha256}`, { headers })
      .then((r) => (r.ok ? r.blob() : null))
      .then((b) => { if (b) img.src = URL.createObjectURL(b); })
      .catch(() => {});
  }
  const grid = image?.grid_thw?.join("×") ?? "?";
  const text = image
    ? `image ${image.width}×${image.height} · grid ${grid} · ${count} tokens`
    : `image · ${count} tokens`;
  return el("span", {
    class: "image-mark", role: "img", title: image ? `${image.mime} · sha256 ${image.sha256}` : undefined,
    dataset: { pos, count, sha256: image?.sha256, grid: image?.grid_thw?.join("x") },
  }, img, el("span", { class: "image-caption", text }));
}

// Heat buckets by logprob: the less likely the sampled token, the stronger.
const HEAT = [-0.1, -0.5, -1, -2, -4];
export function heat(lp) {
  if (lp === null || lp === undefined) return "h-none";
  const i = HEAT.findIndex((t) => lp >= t);
  return `h${i === -1 ? HEAT.length : i}`;
}

// Token text with its whitespace made visible.
export function shown(text, id) {
  if (text === undefined) return `[${id}]`;
  if (text === "") return "∅";
  return text.replace(/\n/g, "↵\n").replace(/\t/g, "→\t");
}

function messageText(m) {
  if (typeof m?.content === "string") return m.content;
  const image = (p) => ["image_url", "input_image", "image"].includes(p.type);
  if (Array.isArray(m?.content)) return m.content.map((p) => p.text ?? (image(p) ? "[image]" : "")).join("");
  return "";
}

// What a call's new prompt tokens hold: the messages after the request's
// last assistant message (tool results, a user turn).
function observationLabel(call) {
  const msgs = call?.request?.messages;
  if (!Array.isArray(msgs)) return null;
  let last = -1;
  msgs.forEach((m, i) => { if (m.role === "assistant") last = i; });
  const after = msgs.slice(last + 1);
  const tools = after.filter((m) => m.role === "tool");
  if (tools.length) {
    const what = tools.map((m) => m.name || m.tool_call_id || "tool").join(", ");
    return { kind: "toolresult", text: `tool result${tools.length > 1 ? "s" : ""}: ${what}` };
  }
  if (after.some((m) => m.role === "user")) return { kind: "user", text: "user turn" };
  return null;
}

function toolCallLabel(call) {
  const tcs = call?.response?.tool_calls;
  if (!Array.isArray(tcs) || !tcs.length) return null;
  const names = tcs.map((t) => t.function?.name || "?").join(", ");
  return { kind: "toolcall", text: `tool call: ${names}` };
}

export function describe(tok) {
  const d = tok.dataset;
  const parts = [
    `token ${d.tokenId}`,
    `text ${JSON.stringify(d.text ?? "")}`,
    d.mask === "1" ? "sampled" : d.kind,
    d.logprob !== "" ? `logprob ${Number(d.logprob).toFixed(4)} (p ${Math.exp(Number(d.logprob)).toFixed(3)})` : "no logprob",
    `call ${d.call}`,
    `api ${d.api || "—"}`,
    `backend ${d.backend || "—"}`,
    `policy ${d.policy || "—"}`,
    `weights ${d.weights || "initial"}${d.version ? ` (#${d.version})` : ""}`,
    `position ${d.pos}`,
  ];
  if (d.drift) parts.push(`drift: ${d.drift}`);
  if (d.replay) parts.push(`replay: ${d.replay}`);
  return parts.join(" · ");
}

// The served id of the policy that served `call`: its LoRA adapter, else
// its model (null for a call recorded without one).
export function policyOf(call) {
  return call?.adapter ?? call?.model ?? null;
}

// The weights that sampled token `k` of `call`: the last of its version
// spans starting at or before `k` (null when the call has none).
function versionAt(call, k) {
  let found = null;
  for (const v of call?.versions || []) if (v.start <= k) found = v;
  return found;
}

// Harmony (gpt-oss) messages in a token stream: `<|start|>` or
// `<|channel|>` opens a header, `<|message|>` ends it and starts the body of
// its channel (`analysis`, `commentary`, `final`; ` to=X` names a
// recipient), `<|end|>` / `<|call|>` / `<|return|>` end the body. Other
// formats never meet these tokens, so nothing changes for them.
const HARMONY_END = new Set(["<|end|>", "<|call|>", "<|return|>"]);
export class HarmonyChannels {
  constructor() { this.header = null; this.channel = null; }
  // The chip to put before this token (null for none), then the channel
  // class the token gets ("" outside a Harmony body).
  step(text) {
    let chip = null;
    if (text === "<|start|>" || (text === "<|channel|>" && this.header === null)) {
      this.header = "";
      this.channel = null;
    }
    const cls = this.channel ? ` ch ch-${this.channel}` : "";
    if (text === "<|message|>" && this.header !== null) {
      const h = this.header;
      const author = h.replace("<|start|>", "").trim().split(/[\s<]/)[0];
      const channel = (h.split("<|channel|>")[1] ?? "").trim().split(/[\s<]/)[0];
      const to = (h.match(/to=([^\s<]+)/) || [])[1];
      this.channel = channel.replace(/[^\w-]/g, "") || "none";
      this.header = null;
      // The author when it is not the assistant (system, user, a tool).
      const who = author && author !== "assistant" ? `${author} · ` : "";
      chip = { channel: this.channel, text: `${who}${channel || "message"}${to ? ` → ${to}` : ""}` };
    } else if (this.header !== null) {
      this.header += text;
    } else if (HARMONY_END.has(text)) {
      this.channel = null;
    }
    return { chip, cls };
  }
}

// The sample's spans, in a fragment; `texts` maps id -> decoded text.
export function tokenStream(sample, calls, drifts, texts) {
  const channels = new HarmonyChannels();
  const frag = document.createDocumentFragment();
  const driftAt = new Map();
  const total = sample.prompt_ids.length + sample.response_ids.length;
  for (const d of drifts) {
    const at = Math.min(d.position, total);
    driftAt.set(at, [...(driftAt.get(at) || []), d]);
  }
  const replayAt = new Map();
  for (const r of sample.replays || (sample.replay ? [sample.replay] : [])) {
    for (const p of r.positions || []) {
      replayAt.set(sample.prompt_ids.length + p.position, p);
    }
  }
  const driftMark = (d) => el("span", {
    class: "drift-mark", role: "note", title: JSON.stringify(d.details ?? {}),
    dataset: { call: d.call, position: d.position, cause: d.cause },
    text: `⚠ drift: ${d.cause} (call ${d.call}, prompt position ${d.position})`,
  });
  let pos = 0;
  let lastCall = null;
  // The images of the sample's last call are every image of the sample, in
  // the order of their runs.
  const images = calls.get(sample.calls[sample.calls.length - 1])?.images || [];
  let nextImage = 0;
  for (const seg of sample.segments) {
    const call = calls.get(seg.call);
    if (seg.call !== lastCall) {
      lastCall = seg.call;
      const policy = policyOf(call);
      frag.append(el("span", {
        class: "boundary", role: "separator", dataset: { call: seg.call, api: call?.api ?? "", policy: policy ?? "" },
        text: `call ${seg.call}${call?.api ? ` · ${call.api}` : ""} · ${call?.backend ?? "?"}${call?.weight_version ? ` · weights ${call.weight_version}` : ""} `,
      }, policy ? el("span", { class: `policy-chip${call.adapter ? " adapter" : ""}`, text: policy }) : null));
    }
    const label = seg.kind === "sampled" ? toolCallLabel(call)
      : seg.kind === "observation" ? observationLabel(call) : null;
    const wrap = el("span", {
      class: `seg seg-${seg.kind}${label ? ` seg-${label.kind}` : ""}`,
      dataset: { call: seg.call, kind: seg.kind }, title: seg.text ?? undefined,
    });
    if (label) wrap.append(el("span", { class: `label label-${label.kind}`, text: label.text }));
    seg.ids.forEach((id, k) => {
      const sampled = seg.kind === "sampled";
      const lp = sampled ? call?.logprobs?.[k] ?? null : null;
      const ds = driftAt.get(pos);
      for (const d of ds || []) wrap.append(driftMark(d));
      const r = replayAt.get(pos);
      // Sampled tokens are underlined in their weight version's colour; a
      // seam (weights changed mid-call) is marked where it sits.
      const ver = sampled ? versionAt(call, k) : null;
      if (ver && ver.start === k && k > 0) {
        wrap.append(el("span", {
          class: "seam-mark", role: "note", dataset: { call: seg.call, position: k },
          text: `⇢ weights ${ver.version ?? "initial"}${ver.seq != null ? ` (#${ver.seq})` : ""}`,
        }));
      }
      if (texts[id] === IMAGE_PAD) {
        if (k === 0 || texts[seg.ids[k - 1]] !== IMAGE_PAD) {
          let n = 0;
          while (k + n < seg.ids.length && texts[seg.ids[k + n]] === IMAGE_PAD) n += 1;
          wrap.append(imageChip(images[nextImage], pos, n));
          nextImage += 1;
        }
        pos += 1;
        return;
      }
      const verClass = ver?.seq != null ? ` ver${ver.seq % 6}` : "";
      const { chip, cls: chClass } = channels.step(texts[id] ?? "");
      const span = el("span", {
        class: `tok ${sampled ? "sampled" : seg.kind} ${sampled ? heat(lp) : ""}${verClass}${chClass}${ds ? " drift" : ""}${r ? " replay-diff" : ""}`,
        dataset: {
          mask: sampled ? 1 : 0, tokenId: id, logprob: lp ?? "", pos, call: seg.call, kind: seg.kind,
          api: call?.api ?? "", backend: call?.backend ?? "", policy: policyOf(call) ?? "",
          weights: (sampled ? ver?.version : null) ?? call?.weight_version ?? "",
          version: ver?.seq ?? "",
          text: texts[id] ?? "", drift: ds?.map((d) => d.cause).join(", "), replay: r ? `recorded ${r.recorded}, replayed ${r.replayed}` : undefined,
        },
        text: shown(texts[id], id),
      });
      span.title = describe(span);
      wrap.append(span);
      if (chip) {
        wrap.append(el("span", {
          class: `channel-mark ch-${chip.channel}`, role: "note",
          dataset: { channel: chip.channel, pos }, text: chip.text,
        }));
      }
      pos += 1;
    });
    frag.append(wrap);
  }
  for (const d of driftAt.get(total) || []) frag.append(driftMark(d));
  return frag;
}

// The conversation of the sample's last call, as messages.
export function messageView(sample, calls) {
  const leaf = calls.get(sample.calls[sample.calls.length - 1]);
  const msgs = [...(leaf?.request?.messages || [])];
  if (leaf?.response) msgs.push(leaf.response);
  return el("ol", { class: "messages" }, ...msgs.map((m) => el(
    "li", { class: `msg msg-${m.role}` },
    el("div", { class: "role", text: m.role + (m.name ? ` (${m.name})` : "") + (m.tool_call_id ? ` · ${m.tool_call_id}` : "") }),
    m.reasoning_content ? el("pre", { class: "reasoning", text: m.reasoning_content }) : null,
    messageText(m) ? el("pre", { class: "content", text: messageText(m) }) : null,
    ...(m.tool_calls || []).map((t) => el("pre", {
      class: "toolcall", text: `→ ${t.function?.name}(${t.function?.arguments ?? ""})`,
    })),
  )));
}
