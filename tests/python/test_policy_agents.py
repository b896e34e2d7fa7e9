"""Two policies in one conversation through the official OpenAI SDK: a
planner on the base model and a coder on its LoRA adapter take turns on one
trajectory (`tito serve`, real Qwen3 tokenizer, scripted mock vLLM). The
export for each policy (`?model=` / `?adapter=`, also through the `tito`
package) has the mask 1 exactly on that policy's sampled ids, and both carry
every sampled id verbatim."""

import json
import urllib.error
import urllib.request

import openai
import pytest
from openai import OpenAI
from transformers import AutoTokenizer

import harness
import tito_rl_support  # noqa: F401  (puts python/src on sys.path)
import tito  # noqa: E402

TOKENIZER = harness.ROOT / ".cache" / "tokenizers" / "qwen3"
MODEL = "test-model"
CODER = "coder-lora"
TURNS = [
    (MODEL, "Plan: write add(a, b), then test it."),
    (CODER, "def add(a, b):\n    return a + b"),
    (MODEL, "Plan: now a test."),
    (CODER, "assert add(2, 3) == 5"),
]


def export(addr, query):
    url = f"http://{addr}/v1/export?format=jsonl&{query}"
    with urllib.request.urlopen(url) as r:
        return [json.loads(line) for line in r.read().decode().splitlines()]


def check_viewer(addr, whole, offsets, script):
    """The viewer names each call's policy on its boundary and on each of
    its tokens."""
    exe = harness.chromium_path()
    if exe is None:
        pytest.fail("missing chromium: run scripts/setup-system.sh")
    browser = harness.Browser(exe)
    try:
        browser.size(1280, 900)
        browser.goto(f"http://{addr}/ui/trajectories/duo")
        browser.wait_for("document.querySelectorAll('.sample .tok').length > 0")
        dom = browser.eval(
            """(() => ({
              chips: [...document.querySelectorAll('.sample .boundary .policy-chip')]
                .map(c => [c.textContent, c.classList.contains('adapter')]),
              policies: [...document.querySelectorAll('.sample span.tok')].map(t => t.dataset.policy),
              masks: [...document.querySelectorAll('.sample span.tok')].map(t => Number(t.dataset.mask)),
              listed: document.querySelector('.sample dd.policies').textContent,
              title: document.querySelector('.sample span.tok.sampled').title,
            }))()"""
        )
    finally:
        browser.close()
    assert dom["chips"] == [[MODEL, False], [CODER, True], [MODEL, False], [CODER, True]]
    assert dom["listed"] == f"{MODEL}, {CODER}"
    assert f"policy {MODEL}" in dom["title"]
    # Each sampled token names the policy that sampled it.
    prompt = len(whole["prompt_ids"])
    sampled = [p for p, m in zip(dom["policies"], dom["masks"]) if m == 1]
    want = [speaker for (speaker, _), ids in zip(TURNS, script) for _ in ids]
    assert sampled == want
    assert len(dom["policies"]) == prompt + len(whole["response_ids"])
    assert offsets[0] == 0


def test_planner_and_coder_each_export_their_own_actions():
    if not (TOKENIZER / "tokenizer.json").exists():
        pytest.fail("missing .cache/tokenizers/qwen3: run scripts/fetch-tokenizers.sh")
    harness.build()
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    script = [tok.encode(text, add_special_tokens=False) + [im_end] for _, text in TURNS]
    mock, mock_addr = harness.start_mock([im_end], script=script)
    adapters = f'[[model.adapters]]\nname = "{CODER}"\npath = "/loras/coder"\n'
    gw, addr = harness.start_tito(TOKENIZER, f"http://{mock_addr}", model_extra=adapters)
    try:
        client = OpenAI(base_url=f"http://{addr}/t/duo/v1", api_key="unused")
        assert [m.id for m in client.models.list()] == [MODEL, CODER]
        with pytest.raises(openai.NotFoundError) as err:
            client.chat.completions.create(model="judge", messages=[{"role": "user", "content": "?"}])
        assert MODEL in str(err.value) and CODER in str(err.value)

        messages = [{"role": "user", "content": "Write add and test it."}]
        for model, text in TURNS:
            answer = client.chat.completions.create(model=model, messages=messages)
            assert answer.choices[0].message.content == text
            messages.append({"role": "assistant", "content": text})
            messages.append({"role": "user", "content": "Go on."})

        calls = harness.http_json(addr, "/v1/trajectories/duo")["calls"]
        assert [(c["model"], c["adapter"]) for c in calls] == [
            (MODEL, None), (MODEL, CODER), (MODEL, None), (MODEL, CODER)]

        whole = export(addr, "trajectory=duo")
        assert len(whole) == 1, "the turns continue one sample"
        whole = whole[0]
        offsets = whole["call_offsets"]
        for policy, query in [(MODEL, f"model={MODEL}"), (CODER, f"adapter={CODER}")]:
            rows = export(addr, f"trajectory=duo&{query}")
            assert len(rows) == 1
            row = rows[0]
            assert row["response_ids"] == whole["response_ids"]
            assert row["prompt_ids"] == whole["prompt_ids"]
            want = [0] * len(row["response_ids"])
            for (speaker, _), ids, at in zip(TURNS, script, offsets):
                assert row["response_ids"][at : at + len(ids)] == ids, "sampled ids verbatim"
                if speaker == policy:
                    want[at : at + len(ids)] = [1] * len(ids)
            assert row["response_mask"] == want, policy
            assert [lp is not None for lp in row["response_logprobs"]] == [m == 1 for m in want]
            assert row["adapter"] == (CODER if policy == CODER else None)

        # The trainer package passes the filters through.
        with tito.Client(f"http://{addr}") as trainer:
            table = trainer.export(adapter=CODER)
        rows = table.to_pylist()
        assert len(rows) == 1 and rows[0]["adapter"] == CODER
        assert sum(rows[0]["response_mask"]) == len(script[1]) + len(script[3])

        with pytest.raises(urllib.error.HTTPError) as bad:
            export(addr, "model=")
        assert bad.value.code == 400
        assert json.load(bad.value)["error"]["param"] == "model"

        check_viewer(addr, whole, offsets, script)
    finally:
        for p in (gw, mock):
            p.terminate()
            p.wait(timeout=30)
