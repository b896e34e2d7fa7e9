"""The trajectory viewer (`/ui`) in a real browser: headless Debian
chromium (installed by scripts/setup-system.sh) driven over the DevTools
protocol, against `tito serve` in front of a scripted mock backend.

A 3-turn tool-calling trajectory is recorded through the gateway (the mock's
tool calls are tokenized non-canonically, so the re-rendered history drifts),
rewarded and finished; the rendered DOM must then agree with
`GET /v1/trajectories/{id}`: one sampled span per 1 in the response mask, the
drift mark at the recorded position, the reward shown. Screenshots (1280 px
and 390 px wide) go to target/test-artifacts/ui/.

A gpt-oss trajectory (Harmony format, a tool call then the answer) must show
a channel chip after each message's `<|message|>` and its body's tokens
marked with the channel; the Qwen3 one, none."""

import json
import time
import urllib.error
import urllib.request

import pytest
from openai import OpenAI
from transformers import AutoTokenizer

import harness

TOKENIZER = harness.ROOT / ".cache" / "tokenizers" / "qwen3"
GPTOSS = harness.ROOT / ".cache" / "tokenizers" / "gptoss"
HARMONY = 'chat_template = "harmony"\ntool_parser = "gpt_oss"\nreasoning_parser = "gpt_oss"'
ARTIFACTS = harness.ROOT / "target" / "test-artifacts" / "ui"
TRAINER_TOKEN = "trainer-secret-123"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": desc,
            "parameters": {"type": "object", "properties": {arg: {"type": "string"}}, "required": [arg]},
        },
    }
    for name, desc, arg in [("calculator", "Evaluate arithmetic.", "expression"), ("lookup", "Look up a fact.", "key")]
]


def pieces(tok, parts):
    """Token ids of `parts` tokenized one by one (valid, not canonical)."""
    return [i for p in parts for i in tok.encode(p, add_special_tokens=False)]


def get(addr, path, token=None):
    req = urllib.request.Request(f"http://{addr}{path}")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req) as r:
        return json.load(r)


def post(addr, path, body, token=None):
    req = urllib.request.Request(
        f"http://{addr}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req) as r:
        return json.load(r)


def run_agent(addr, tid, token=None):
    """Three calls: two tool calls answered with tool results, then the
    answer; then a reward and finish."""
    client = OpenAI(base_url=f"http://{addr}/t/{tid}/v1", api_key="unused")
    msgs = [{"role": "user", "content": "What is 2+2, and what is the capital of France?"}]
    results = iter(["4", "Paris"])
    for _ in range(3):
        msg = client.chat.completions.create(model="test-model", messages=msgs, tools=TOOLS).choices[0].message
        msgs.append(msg.model_dump(exclude_none=True))
        for tc in msg.tool_calls or []:
            msgs.append({"role": "tool", "tool_call_id": tc.id, "name": tc.function.name, "content": next(results)})
    assert "Paris" in msgs[-1]["content"]
    post(addr, f"/v1/trajectories/{tid}/reward", {"reward": 0.75}, token)
    post(addr, f"/v1/trajectories/{tid}/finish", {}, token)


@pytest.fixture(scope="module")
def env():
    if not (TOKENIZER / "tokenizer.json").exists():
        pytest.fail("missing .cache/tokenizers/qwen3: run scripts/fetch-tokenizers.sh")
    exe = harness.chromium_path()
    if exe is None:
        pytest.fail("missing chromium: run scripts/setup-system.sh")
    harness.build()
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    script = [
        pieces(tok, ["<tool_call>", '\n{"name":  "', "c", "alc", "ulator", '", "arguments": {"expression":"2+2"}}\n', "</tool_call>"]) + [im_end],
        pieces(tok, ["<tool_call>", '\n{"name": "lookup",  "arguments": {"key": "capital_', "of_france", '"}}\n', "</tool_call>"]) + [im_end],
        pieces(tok, ["2+2 is 4 and the capital of France is Paris."]) + [im_end],
    ]
    # After the script: a plain answer (for the trajectories made later).
    mock, mock_addr = harness.start_mock(pieces(tok, ["Paris."]) + [im_end], script=script)
    procs = [mock]
    browser = None
    try:
        tito, addr = harness.start_tito(TOKENIZER, f"http://{mock_addr}")
        procs.append(tito)
        # Name the mock's weights: every sampled token then carries its
        # version's number.
        post(addr, "/admin/weights", {"version": "ui-v1"})
        run_agent(addr, "agent-ui-1")
        browser = harness.Browser(exe)
        yield addr, browser, mock_addr
    finally:
        if browser is not None:
            browser.close()
        for p in procs:
            p.terminate()
            p.wait(timeout=30)


def test_token_view_matches_the_recorded_trajectory(env):
    addr, browser, _ = env
    t = get(addr, "/v1/trajectories/agent-ui-1")
    assert len(t["samples"]) == 1 and t["samples"][0]["num_turns"] == 3
    sample = t["samples"][0]
    seq = sample["prompt_ids"] + sample["response_ids"]
    assert t["drift"], "the re-rendered tool calls differ from the sampled ids"

    browser.size(1280, 900)
    browser.goto(f"http://{addr}/ui/trajectories/agent-ui-1")
    browser.wait_for("document.querySelectorAll('.sample .tok').length > 0")
    dom = browser.eval(
        """(() => {
          const toks = [...document.querySelectorAll('.sample[data-sample="0"] span.tok')];
          return {
            ids: toks.map(s => Number(s.dataset.tokenId)),
            masks: toks.map(s => Number(s.dataset.mask)),
            sampledClass: toks.filter(s => s.classList.contains('sampled')).length,
            sampledMaskOne: toks.filter(s => s.classList.contains('sampled')).every(s => s.dataset.mask === '1'),
            logprobs: toks.filter(s => s.dataset.mask === '1').map(s => s.dataset.logprob),
            versions: toks.filter(s => s.dataset.mask === '1').map(s => [s.dataset.version, s.dataset.weights, s.classList.contains('ver1')]),
            seams: document.querySelectorAll('.sample .seam-mark').length,
            // Each drift mark and the token right after it.
            drift: [...document.querySelectorAll('.sample[data-sample="0"] .drift-mark')].map(m => {
              let s = m.nextElementSibling;
              while (s && !s.classList.contains('tok')) s = s.nextElementSibling;
              return {call: Number(m.dataset.call), position: Number(m.dataset.position), cause: m.dataset.cause,
                      pos: Number(s.dataset.pos), id: Number(s.dataset.tokenId), tokCauses: s.dataset.drift,
                      drifted: s.classList.contains('drift')};
            }),
            reward: document.getElementById('reward').textContent,
            boundaries: document.querySelectorAll('.sample .boundary').length,
            boundaryApis: [...document.querySelectorAll('.sample .boundary')].map(b => b.dataset.api),
            toolCalls: document.querySelectorAll('.sample .label-toolcall').length,
            toolResults: document.querySelectorAll('.sample .label-toolresult').length,
            title: document.querySelector('.sample span.tok.sampled').title,
          };
        })()"""
    )
    # Every token of the sample, in order, with the mask of the API.
    assert dom["ids"] == seq
    assert dom["masks"] == [0] * len(sample["prompt_ids"]) + sample["response_mask"]
    assert dom["sampledClass"] == sum(sample["response_mask"]) > 0
    assert dom["sampledMaskOne"]
    assert all(lp != "" for lp in dom["logprobs"]), "the mock reports a logprob per sampled token"
    # Each sampled token in its weight version's colour; no seam in calls
    # no update interrupted.
    assert dom["versions"] and all(v == ["1", "ui-v1", True] for v in dom["versions"]), dom["versions"]
    assert dom["seams"] == 0
    # One drift mark per record, on the token at the recorded position.
    want = sorted((d["call"], d["position"], d["cause"]) for d in t["drift"])
    assert sorted((d["call"], d["pos"], d["cause"]) for d in dom["drift"]) == want
    for d in dom["drift"]:
        assert d["pos"] == d["position"] and d["id"] == seq[d["pos"]]
        assert d["drifted"] and d["cause"] in d["tokCauses"]
    assert dom["reward"] == "0.75"
    assert dom["boundaries"] == 3
    # Each call's boundary names the surface it came through.
    assert dom["boundaryApis"] == [c["api"] for c in t["calls"]] == ["chat"] * 3
    assert dom["toolCalls"] == 2 and dom["toolResults"] == 2
    assert "call 0" in dom["title"] and "logprob" in dom["title"] and "backend" in dom["title"]
    assert "api chat" in dom["title"]
    # Qwen3 has no Harmony messages: no channel chip, no channel class.
    assert browser.eval("document.querySelectorAll('.channel-mark, .tok.ch').length") == 0
    browser.screenshot(ARTIFACTS / "trajectory-1280.png")

    # Message view toggles; keyboard walks tokens.
    assert browser.eval(
        """(() => { document.querySelector('.sample .toggle').click();
          const shown = (sel) => getComputedStyle(document.querySelector(sel)).display !== 'none';
          return shown('.sample .messages') && !shown('.sample .tokens')
            && document.querySelectorAll('.sample .msg').length === 6; })()"""
    )
    browser.screenshot(ARTIFACTS / "messages-1280.png")
    assert browser.eval(
        """(() => { document.querySelector('.sample .toggle').click();
          const shown = (sel) => getComputedStyle(document.querySelector(sel)).display !== 'none';
          return !shown('.sample .messages') && shown('.sample .tokens'); })()"""
    )
    assert browser.eval(
        """(() => { const s = document.querySelector('.sample .tokens'); s.focus();
          s.dispatchEvent(new KeyboardEvent('keydown', {key: 'd', bubbles: true}));
          return document.querySelector('.tok.cur').classList.contains('drift')
            && document.querySelector('.sample .inspector').textContent.includes('drift'); })()"""
    )

    browser.size(390, 844, mobile=True)
    browser.goto(f"http://{addr}/ui/trajectories/agent-ui-1")
    browser.wait_for("document.querySelectorAll('.sample .tok').length > 0")
    # Nothing wider than the phone but the token box's own scrolling.
    assert browser.eval("document.documentElement.scrollWidth") <= 390
    browser.screenshot(ARTIFACTS / "trajectory-390.png")
    browser.size(1280, 900)


def test_unknown_trajectory_says_so(env):
    addr, browser, _ = env
    browser.goto(f"http://{addr}/ui/trajectories/no-such-trajectory")
    text = browser.wait_for("document.querySelector('#error.not-found')?.textContent")
    assert "no-such-trajectory" in text and "No trajectory" in text


def test_list_shows_a_new_trajectory_within_two_seconds(env):
    addr, browser, _ = env
    browser.size(1280, 900)
    browser.goto(f"http://{addr}/ui")
    browser.wait_for("document.querySelector('#trajectories tr[data-id=\"agent-ui-1\"]')")
    assert browser.eval("document.querySelector('#trajectories tr[data-id=\"agent-ui-1\"] td.reward').textContent") == "0.75"
    # Drift and token counts are the summary's (no per-trajectory fetch).
    browser.wait_for("document.querySelector('#trajectories tr[data-id=\"agent-ui-1\"] td.has-drift')")
    summary = next(t for t in get(addr, "/v1/trajectories")["data"] if t["id"] == "agent-ui-1")
    assert summary["drift_count"] >= 1 and summary["num_tokens"] > 0, summary
    cells = browser.eval("[...document.querySelectorAll('#trajectories tr[data-id=\"agent-ui-1\"] td.num:not(.reward)')].map(c => c.textContent)")
    assert cells == [str(summary["num_calls"]), str(summary["num_tokens"]), str(summary["drift_count"])], cells

    client = OpenAI(base_url=f"http://{addr}/t/agent-ui-2/v1", api_key="unused")
    client.chat.completions.create(model="test-model", messages=[{"role": "user", "content": "Capital of France?"}])
    post(addr, "/v1/trajectories/agent-ui-2/finish", {})
    finished = time.monotonic()
    browser.wait_for("document.querySelector('#trajectories tr[data-id=\"agent-ui-2\"][data-status=\"finished\"]')", timeout=2.0)
    assert time.monotonic() - finished < 2.0
    # Filters: drift present keeps agent-ui-1 only; reward >= 0.5 likewise.
    shown = """[...document.querySelectorAll('#trajectories tbody tr')].map(r => r.dataset.id).sort()"""
    browser.eval("""(() => { const f = document.getElementById('filters');
        f.elements.drift.value = 'yes'; f.dispatchEvent(new Event('input')); })()""")
    assert browser.wait_for(f"(() => {{ const s = {shown}; return s.length === 1 && s; }})()") == ["agent-ui-1"]
    browser.eval("""(() => { const f = document.getElementById('filters');
        f.elements.drift.value = ''; f.elements.min_reward.value = '0.5'; f.dispatchEvent(new Event('input')); })()""")
    assert browser.eval(shown) == ["agent-ui-1"]
    browser.screenshot(ARTIFACTS / "list-1280.png")
    browser.size(390, 844, mobile=True)
    browser.screenshot(ARTIFACTS / "list-390.png")
    browser.size(1280, 900)


def test_trainer_token_is_asked_for_and_api_is_401_until_given(env):
    _, browser, mock_addr = env
    tito, addr = harness.start_tito(
        TOKENIZER, f"http://{mock_addr}",
        extra_config=f'[auth]\ntrainer_tokens = ["{TRAINER_TOKEN}"]',
    )
    try:
        # The shell loads without a token; the data does not.
        with urllib.request.urlopen(f"http://{addr}/ui") as r:
            assert r.status == 200 and "text/html" in r.headers["content-type"]
        for path in ("/v1/trajectories", "/v1/trajectories/x"):
            with pytest.raises(urllib.error.HTTPError) as e:
                get(addr, path)
            assert e.value.code == 401
        with pytest.raises(urllib.error.HTTPError) as e:
            post(addr, "/ui/api/decode", {"ids": [1]})
        assert e.value.code == 401
        assert get(addr, "/v1/trajectories", TRAINER_TOKEN)["object"] == "list"

        browser.goto(f"http://{addr}/ui")
        browser.eval("sessionStorage.clear()")
        browser.goto(f"http://{addr}/ui")
        browser.wait_for("document.querySelector('form#login input#token')")
        assert not browser.eval("document.querySelector('#trajectories')")
        # A wrong token is refused and asked for again.
        login = """(t) => { document.getElementById('token').value = t;
            document.getElementById('login').requestSubmit(); }"""
        browser.eval(f"({login})('wrong-token-1')")
        browser.wait_for("document.querySelector('#login-help')?.textContent.includes('refused')")
        browser.eval(f"({login})({json.dumps(TRAINER_TOKEN)})")
        browser.wait_for("document.querySelector('#trajectories')")
        assert browser.eval("sessionStorage.length") == 1
        # The token can also come in the link's fragment, which is then removed.
        browser.eval("sessionStorage.clear()")
        browser.goto(f"http://{addr}/ui/trajectories/none-here#token={TRAINER_TOKEN}")
        browser.wait_for("document.querySelector('#error.not-found')")
        assert browser.eval("location.hash") == ""
    finally:
        browser.eval("sessionStorage.clear()")
        tito.terminate()
        tito.wait(timeout=30)


# --- gpt-oss (Harmony): channels marked in the token view ---

WEATHER = [{
    "type": "function",
    "function": {
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]
# Harmony ids: the message ends the token view must find.
MESSAGE, END, CALL, RETURN = 200008, 200007, 200012, 200002


@pytest.fixture(scope="module")
def harmony_env():
    """tito on the gpt-oss tokenizer with the Harmony config, a two-call
    agent trajectory `oss-ui-1` recorded through the OpenAI SDK, a browser."""
    if not (GPTOSS / "tokenizer.json").exists():
        pytest.fail("missing .cache/tokenizers/gptoss: run scripts/fetch-tokenizers.sh")
    exe = harness.chromium_path()
    if exe is None:
        pytest.fail("missing chromium: run scripts/setup-system.sh")
    harness.build()
    tok = AutoTokenizer.from_pretrained(str(GPTOSS))
    assert [tok.convert_tokens_to_ids(t) for t in ("<|message|>", "<|end|>", "<|call|>", "<|return|>")] == [
        MESSAGE, END, CALL, RETURN]
    # Each completion from right after the prompt's `<|start|>assistant`.
    script = [
        pieces(tok, [
            "<|channel|>analysis<|message|>", "Need the w", "eather.",
            "<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
            '{"ci', 'ty": "Par', 'is"}', "<|call|>",
        ]),
        pieces(tok, [
            "<|channel|>analysis<|message|>", "It is sunny.",
            "<|end|><|start|>assistant<|channel|>final<|message|>", "Sunny in P", "aris, 21 °C.", "<|return|>",
        ]),
    ]
    assert script[0][-1] == CALL and script[1][-1] == RETURN
    mock, mock_addr = harness.start_mock(pieces(tok, ["<|channel|>final<|message|>", "OK.", "<|return|>"]),
                                         script=script)
    procs = [mock]
    browser = None
    try:
        tito, addr = harness.start_tito(GPTOSS, f"http://{mock_addr}", model="gpt-oss", model_extra=HARMONY)
        procs.append(tito)
        client = OpenAI(base_url=f"http://{addr}/t/oss-ui-1/v1", api_key="unused")
        msgs = [{"role": "user", "content": "Weather in Paris?"}]
        first = client.chat.completions.create(model="gpt-oss", messages=msgs, tools=WEATHER).choices[0]
        assert first.finish_reason == "tool_calls", first
        (call,) = first.message.tool_calls
        assert call.function.name == "get_weather"
        msgs.append(first.message.model_dump(exclude_none=True))
        msgs.append({"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 °C"})
        second = client.chat.completions.create(model="gpt-oss", messages=msgs, tools=WEATHER).choices[0]
        assert second.message.content == "Sunny in Paris, 21 °C.", second
        post(addr, "/v1/trajectories/oss-ui-1/finish", {})
        browser = harness.Browser(exe)
        yield addr, browser, script
    finally:
        if browser is not None:
            browser.close()
        for p in procs:
            p.terminate()
            p.wait(timeout=30)


def test_harmony_channels_are_marked(harmony_env):
    addr, browser, script = harmony_env
    t = get(addr, "/v1/trajectories/oss-ui-1")
    assert len(t["samples"]) == 1, "both calls in one sample"
    sample = t["samples"][0]
    seq = sample["prompt_ids"] + sample["response_ids"]
    assert [c["sampled_ids"] for c in t["calls"]] == script

    browser.size(1280, 900)
    browser.goto(f"http://{addr}/ui/trajectories/oss-ui-1")
    browser.wait_for("document.querySelectorAll('.sample .tok').length > 0")
    dom = browser.eval(
        """((ends) => {
          const root = document.querySelector('.sample[data-sample="0"]');
          const toks = [...root.querySelectorAll('span.tok')];
          const byPos = new Map(toks.map((s, i) => [Number(s.dataset.pos), i]));
          const chips = [...root.querySelectorAll('.channel-mark')].map(c => {
            const prev = c.previousElementSibling;
            const want = `ch-${c.dataset.channel}`;
            // The body: every token after the chip up to the message's end.
            const body = [];
            for (let i = byPos.get(Number(c.dataset.pos)) + 1; i < toks.length; i++) {
              const s = toks[i];
              if (ends.includes(Number(s.dataset.tokenId))) break;
              body.push({pos: Number(s.dataset.pos), marked: s.classList.contains(want) && s.classList.contains('ch')});
            }
            return {text: c.textContent, channel: c.dataset.channel, pos: Number(c.dataset.pos),
                    classed: c.classList.contains(want),
                    prevPos: prev?.classList.contains('tok') ? Number(prev.dataset.pos) : null,
                    prevId: prev?.classList.contains('tok') ? Number(prev.dataset.tokenId) : null,
                    body};
          });
          return {
            ids: toks.map(s => Number(s.dataset.tokenId)),
            chips,
            analysis: toks.filter(s => s.dataset.mask === '1' && s.classList.contains('ch-analysis')
              && !ends.includes(Number(s.dataset.tokenId))).map(s => s.dataset.text).join(''),
            // Tokens outside every body but its end (headers, the system's
            // own text) in a channel.
            outside: (() => {
              const inBody = new Set(chips.flatMap(c => c.body.map(b => b.pos)));
              return toks.filter(s => !inBody.has(Number(s.dataset.pos)) && !ends.includes(Number(s.dataset.tokenId))
                && s.classList.contains('ch')).map(s => [Number(s.dataset.pos), s.dataset.text]);
            })(),
          };
        })(%s)""" % json.dumps([END, CALL, RETURN])
    )
    assert dom["ids"] == seq
    chips = dom["chips"]
    # One chip per Harmony message of the sample, in order.
    assert [c["text"] for c in chips] == [
        "system · message", "developer · message", "user · message",
        "analysis", "commentary → functions.get_weather",
        "functions.get_weather · commentary → assistant",
        "analysis", "final",
    ], chips
    assert [c["channel"] for c in chips] == [
        "none", "none", "none", "analysis", "commentary", "commentary", "analysis", "final"]
    # Each right after its message's <|message|> token, and no <|message|> without one.
    assert [c["pos"] for c in chips] == [i for i, x in enumerate(seq) if x == MESSAGE]
    for c in chips:
        assert c["classed"] and c["prevPos"] == c["pos"] and c["prevId"] == MESSAGE, c
        assert c["body"], f"empty body after {c['text']}"
        assert all(b["marked"] for b in c["body"]), c
        # The body runs up to the message's end, which is in the sample.
        assert seq[c["body"][-1]["pos"] + 1] in (END, CALL, RETURN), c
    assert dom["outside"] == [], "header tokens are in no channel"
    # The sampled reasoning is marked as the analysis channel.
    assert dom["analysis"] == "Need the weather.It is sunny."
    browser.screenshot(ARTIFACTS / "harmony-1280.png")
