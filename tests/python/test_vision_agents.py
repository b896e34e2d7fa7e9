"""Images through the SDKs people use, against `tito serve` with
`[model] vision = "qwen2_vl"` in front of an SGLang `/generate` mock (here,
in Python, so the wire SGLang receives is checked from outside the Rust
code too).

An OpenAI SDK agent over three turns, whose second observation (a tool
result) carries an image: the first prompt equals transformers' own (the
Qwen-VL template rendered by `apply_chat_template`, each `<|image_pad|>`
expanded by the image processor's grid, as `Qwen2VLProcessor` does), SGLang
received `image_data` in order beside one pad per image, the export is one
sample whose image tokens are all mask 0, and the Parquet and JSONL exports
hand back every image byte for byte (pyarrow reads them). The same images
over the Responses API (OpenAI SDK) and the Messages API (Anthropic SDK).
"""

import base64
import hashlib
import io
import json
import shutil
import tempfile
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from anthropic import Anthropic
from openai import OpenAI
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

import harness

TEMPLATE = harness.ROOT / "tests" / "fixtures" / "templates" / "qwen_vl_tools.jinja"
PREPROCESSOR = {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2, "min_pixels": 3136,
                "max_pixels": 50176, "image_processor_type": "Qwen2VLImageProcessor"}
PAD = "<|image_pad|>"
ZOOM = [{"type": "function", "function": {"name": "zoom", "description": "Zoom into the picture.",
         "parameters": {"type": "object", "properties": {"factor": {"type": "integer"}}, "required": ["factor"]}}}]


def png(w, h, colour):
    buf = io.BytesIO()
    Image.new("RGB", (w, h), colour).save(buf, format="PNG")
    return buf.getvalue()


def data_url(b):
    return "data:image/png;base64," + base64.b64encode(b).decode()


class SglangMock:
    """SGLang's `/generate`: logs each body, answers the next scripted ids
    in one cumulative event (with logprobs when asked)."""

    def __init__(self, script):
        self.script = list(script)
        self.seen = []
        mock = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                mock.seen.append(body)
                ids = mock.script.pop(0) if mock.script else []
                meta = {"completion_tokens": len(ids), "finish_reason": {"type": "stop"}}
                if body.get("return_logprob"):
                    meta["output_token_logprobs"] = [[-0.25, i, None] for i in ids]
                event = json.dumps({"output_ids": ids, "meta_info": meta})
                out = f"data: {event}\n\ndata: [DONE]\n\n".encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def addr(self):
        return f"127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()


@pytest.fixture(scope="module")
def tok():
    return harness.qwen3_tokenizer()


@pytest.fixture(scope="module")
def model_dir():
    """The Qwen3 tokenizer (its vocabulary holds the vision tokens) with a
    Qwen2-VL preprocessor_config.json."""
    src = harness.QWEN3
    tmp = Path(tempfile.mkdtemp(prefix="tito-vision-"))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / f, tmp / f)
    (tmp / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    yield tmp
    shutil.rmtree(tmp)


def gateway(model_dir, mock):
    harness.build()
    extra = f'chat_template = "{TEMPLATE}"\nvision = "qwen2_vl"\nmax_model_len = 4096'
    return harness.start_tito(model_dir, f"http://{mock.addr}", model_extra=extra, kind="sglang")


def transformers_prompt(tok, messages, images):
    """transformers' prompt ids for `messages`: the template rendered by
    `apply_chat_template`, then (as `Qwen2VLProcessor.__call__` does) the
    k-th `<|image_pad|>` repeated grid_t*grid_h*grid_w // merge_size**2
    times for the k-th image, grids from the image processor."""
    processor = Qwen2VLImageProcessorPil(**{k: v for k, v in PREPROCESSOR.items() if k != "image_processor_type"})
    grids = processor(images=[Image.open(io.BytesIO(b)) for b in images])["image_grid_thw"]
    text = tok.apply_chat_template(messages, chat_template=TEMPLATE.read_text(), tools=ZOOM,
                                   tokenize=False, add_generation_prompt=True)
    for g in grids:
        n = int(g[0]) * int(g[1]) * int(g[2]) // PREPROCESSOR["merge_size"] ** 2
        text = text.replace(PAD, "<|placeholder|>" * n, 1)
    text = text.replace("<|placeholder|>", PAD)
    return tok.encode(text, add_special_tokens=False), [list(map(int, g)) for g in grids]


def runs(ids, pad):
    out, n = [], 0
    for t in list(ids) + [None]:
        if t == pad:
            n += 1
        elif n:
            out.append(n)
            n = 0
    return out


def test_an_openai_sdk_agent_with_an_image_in_a_tool_result(tok, model_dir):
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    pad = tok.convert_tokens_to_ids(PAD)
    call = harness.pieces(tok, ["<tool_call>", '\n{"name": "zo', 'om", "arguments": {"factor": 2}}\n', "</tool_call>"])
    script = [call + [im_end], harness.pieces(tok, ["A ", "cat", "."]) + [im_end],
              harness.pieces(tok, ["You're ", "welcome."]) + [im_end]]
    mock = SglangMock(script)
    proc, addr = gateway(model_dir, mock)
    try:
        a, b = png(64, 48, (200, 10, 10)), png(100, 60, (10, 200, 10))
        client = OpenAI(base_url=f"http://{addr}/t/vis-sdk-1/v1", api_key="unused")
        user = {"role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                            {"type": "image_url", "image_url": {"url": data_url(a)}}]}
        msgs = [user]
        first = client.chat.completions.create(model="test-model", messages=msgs, tools=ZOOM).choices[0]
        assert first.finish_reason == "tool_calls"
        (tc,) = first.message.tool_calls
        assert tc.function.name == "zoom" and json.loads(tc.function.arguments) == {"factor": 2}
        msgs.append(first.message.model_dump(exclude_none=True))
        msgs.append({"role": "tool", "tool_call_id": tc.id, "content": [
            {"type": "text", "text": "zoomed:"}, {"type": "image_url", "image_url": {"url": data_url(b)}}]})
        stream = client.chat.completions.create(model="test-model", messages=msgs, tools=ZOOM, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == "A cat."
        msgs.append({"role": "assistant", "content": text})
        msgs.append({"role": "user", "content": "Thanks!"})
        third = client.chat.completions.create(model="test-model", messages=msgs, tools=ZOOM).choices[0]
        assert third.message.content == "You're welcome."

        # The first prompt is transformers' own; SGLang got one pad per image.
        want, grids = transformers_prompt(tok, [{"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"}, {"type": "image"}]}], [a])
        sent = mock.seen
        assert [s["image_data"] for s in sent] == [[data_url(a)], [data_url(a), data_url(b)],
                                                   [data_url(a), data_url(b)]]
        collapsed = [t for i, t in enumerate(want) if t != pad or i == 0 or want[i - 1] != pad]
        assert sent[0]["input_ids"] == collapsed
        assert all(runs(s["input_ids"], pad) == [1] * len(s["image_data"]) for s in sent)

        rows = harness.export_rows(addr, "vis-sdk-1")
        assert len(rows) == 1, "one sample"
        row = rows[0]
        assert row["prompt_ids"] == want
        assert row["image_grid_thw"] == grids + [[1, 4, 8]]
        for i, t in enumerate(row["response_ids"]):
            if t == pad:
                assert row["response_mask"][i] == 0
        assert runs(row["prompt_ids"] + row["response_ids"], pad) == [4, 8]
        assert [base64.b64decode(x) for x in row["images"]] == [a, b]
        assert row["image_sha256"] == [hashlib.sha256(a).hexdigest(), hashlib.sha256(b).hexdigest()]

        # Parquet: the same bytes, read by pyarrow.
        url = f"http://{addr}/v1/export?format=parquet&trajectory=vis-sdk-1"
        with urllib.request.urlopen(url) as r:
            table = pq.read_table(io.BytesIO(r.read()))
        got = table.to_pylist()[0]
        assert got["images"] == [a, b]
        assert got["image_grid_thw"] == row["image_grid_thw"]
        assert got["image_sizes"] == [[64, 48], [100, 60]]

        # The viewer: each pad run is one chip with its image and grid.
        exe = harness.chromium_path()
        assert exe, "missing chromium: run scripts/setup-system.sh"
        browser = harness.Browser(exe)
        try:
            browser.goto(f"http://{addr}/ui/trajectories/vis-sdk-1")
            browser.wait_for("[...document.querySelectorAll('.image-mark img')].filter(i => i.naturalWidth > 0).length == 2")
            dom = browser.eval("""(() => {
              const root = document.querySelector('.sample[data-sample="0"]');
              const chips = [...root.querySelectorAll('.image-mark')];
              return {
                toks: root.querySelectorAll('span.tok').length,
                chips: chips.map(c => [Number(c.dataset.pos), Number(c.dataset.count), c.dataset.grid,
                                       c.querySelector('img').naturalWidth, c.querySelector('img').naturalHeight]),
              };
            })()""")
        finally:
            browser.close()
        seq = row["prompt_ids"] + row["response_ids"]
        starts = [i for i, t in enumerate(seq) if t == pad and (i == 0 or seq[i - 1] != pad)]
        assert dom["chips"] == [[starts[0], 4, "1x4x4", 64, 48], [starts[1], 8, "1x4x8", 100, 60]], dom
        assert dom["toks"] == len(seq) - 12, "every token but the pads is a span"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        mock.close()


def test_responses_and_messages_sdks_send_images(tok, model_dir):
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    answer = harness.pieces(tok, ["A ", "dog."]) + [im_end]
    mock = SglangMock([answer, answer])
    proc, addr = gateway(model_dir, mock)
    try:
        img = png(30, 90, (0, 0, 255))
        client = OpenAI(base_url=f"http://{addr}/t/vis-resp-1/v1", api_key="unused")
        r = client.responses.create(model="test-model", input=[{"role": "user", "content": [
            {"type": "input_text", "text": "What is it?"},
            {"type": "input_image", "image_url": data_url(img), "detail": "auto"}]}])
        assert r.output_text == "A dog."
        anthropic = Anthropic(base_url=f"http://{addr}/t/vis-msg-1", api_key="unused")
        m = anthropic.messages.create(model="test-model", max_tokens=64, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(img).decode()}},
            {"type": "text", "text": "What is it?"}]}])
        assert m.content[0].text == "A dog."
        assert [s["image_data"] for s in mock.seen] == [[data_url(img)], [data_url(img)]]
        for tid in ("vis-resp-1", "vis-msg-1"):
            (row,) = harness.export_rows(addr, tid)
            assert [base64.b64decode(x) for x in row["images"]] == [img]
            assert row["image_grid_thw"] == [[1, 8, 4]]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        mock.close()
