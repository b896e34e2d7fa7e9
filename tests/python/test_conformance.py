"""tito's answers against OpenAI's own published OpenAPI document
(`../shared/openai/openapi.yaml`, see its README): for a table of SDK-shaped
requests, every JSON body and every SSE chunk must validate against the
spec's schema for it (`CreateChatCompletionResponse`,
`CreateChatCompletionStreamResponse`, `CreateCompletionResponse`,
`ListModelsResponse`, `Model`, `ErrorResponse`).

Known quirks of the document (its README lists them), handled here and
nowhere else: it is an OpenAPI 3.1 file that still marks optional values
with 3.0's `nullable: true`, read here as "or null"; and its stream chunk
schemas do not allow the `finish_reason: null` that OpenAI itself sends on
every chunk but the last, so exactly that is not counted as a violation."""

import contextlib
import json
import os
import pathlib
import re
import subprocess
import tempfile
import threading
import time
import types
import urllib.error
import urllib.request

import pytest
import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from transformers import AutoTokenizer

import harness

SPEC = harness.ROOT.parent / "shared" / "openai" / "openapi.yaml"
TOKENIZER = harness.ROOT / ".cache" / "tokenizers" / "qwen3"
BASE = "urn:openai-spec"


def nullable_as_null(node):
    """OpenAPI 3.0's `nullable: true` as JSON Schema's `null` alternative."""
    if isinstance(node, list):
        return [nullable_as_null(x) for x in node]
    if not isinstance(node, dict):
        return node
    node = {k: nullable_as_null(v) for k, v in node.items()}
    if node.pop("nullable", False) is True:
        t = node.get("type")
        if isinstance(t, str):
            node["type"] = [t, "null"]
        elif isinstance(t, list):
            node["type"] = t + ["null"]
        else:
            node = {"anyOf": [node, {"type": "null"}]}
    return node


@pytest.fixture(scope="module")
def validators():
    if not SPEC.exists():
        pytest.fail(f"missing {SPEC}: the OpenAI spec is expected in shared/openai/")
    spec = nullable_as_null(yaml.safe_load(SPEC.read_text()))
    registry = Registry().with_resource(BASE, Resource(contents=spec, specification=DRAFT202012))

    def validator(name):
        schema = {"$ref": f"{BASE}#/components/schemas/{name}"}
        return Draft202012Validator(schema, registry=registry)

    return validator


@pytest.fixture(scope="module")
def gateway():
    if not (TOKENIZER / "tokenizer.json").exists():
        pytest.fail("missing .cache/tokenizers/qwen3: run scripts/fetch-tokenizers.sh")
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    plain = tok.encode("Hello! 你好 🎉", add_special_tokens=False) + [im_end]
    call = tok.encode(
        'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>',
        add_special_tokens=False,
    ) + [im_end]
    # The tool-call requests of the table come first, in order.
    with harness.mock_gateway(TOKENIZER, plain, script=[call, call]) as addr:
        yield addr


def request(addr, method, path, body=None):
    """(status, content type, body text) of one request."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{addr}{path}", data=data, method=method)
    req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, r.headers.get("content-type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("content-type", ""), e.read().decode()


def sse_chunks(text):
    out = []
    for event in text.split("\n\n"):
        data = [line[5:].lstrip() for line in event.splitlines() if line.startswith("data:")]
        if data and data != ["[DONE]"]:
            out.append(json.loads("\n".join(data)))
    return out


MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate arithmetic",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]

# (name, method, path, body, status, schema of the body or of every chunk)
CASES = [
    ("chat tool call", "POST", "/v1/chat/completions",
     {"model": "test-model", "messages": MESSAGES, "tools": TOOLS}, 200, "CreateChatCompletionResponse"),
    ("chat tool call stream", "POST", "/v1/chat/completions",
     {"model": "test-model", "messages": MESSAGES, "tools": TOOLS, "stream": True},
     200, "CreateChatCompletionStreamResponse"),
    ("chat", "POST", "/v1/chat/completions",
     {"model": "test-model", "messages": MESSAGES}, 200, "CreateChatCompletionResponse"),
    ("chat logprobs n=2", "POST", "/v1/chat/completions",
     {"model": "test-model", "messages": MESSAGES, "logprobs": True, "top_logprobs": 2, "n": 2},
     200, "CreateChatCompletionResponse"),
    ("chat parts + developer", "POST", "/v1/chat/completions",
     {"model": "test-model", "messages": [{"role": "developer", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]},
     200, "CreateChatCompletionResponse"),
    ("chat stream usage", "POST", "/v1/chat/completions",
     {"model": "test-model", "messages": MESSAGES, "stream": True,
      "stream_options": {"include_usage": True}, "logprobs": True},
     200, "CreateChatCompletionStreamResponse"),
    ("completion", "POST", "/v1/completions",
     {"model": "test-model", "prompt": "Say hi", "logprobs": 2}, 200, "CreateCompletionResponse"),
    ("completion stream", "POST", "/v1/completions",
     {"model": "test-model", "prompt": ["a", "b"], "stream": True}, 200, "CreateCompletionResponse"),
    ("models", "GET", "/v1/models", None, 200, "ListModelsResponse"),
    ("model", "GET", "/v1/models/test-model", None, 200, "Model"),
    ("bad temperature", "POST", "/v1/chat/completions",
     {"model": "test-model", "messages": MESSAGES, "temperature": 9}, 400, "ErrorResponse"),
    ("unsupported field", "POST", "/v1/chat/completions",
     {"model": "test-model", "messages": MESSAGES, "audio": {"voice": "alloy", "format": "wav"}},
     400, "ErrorResponse"),
    ("unknown model", "POST", "/v1/chat/completions",
     {"model": "gpt-9", "messages": MESSAGES}, 404, "ErrorResponse"),
    ("unknown route", "GET", "/v1/nothing", None, 404, "ErrorResponse"),
    ("wrong method", "GET", "/v1/chat/completions", None, 405, "ErrorResponse"),
]


def test_every_answer_validates_against_openais_schemas(gateway, validators):
    violations = []
    for name, method, path, body, want_status, schema in CASES:
        status, ctype, text = request(gateway, method, path, body)
        assert status == want_status, f"{name}: {status} {text[:300]}"
        streamed = body is not None and body.get("stream")
        if streamed:
            assert ctype.startswith("text/event-stream"), f"{name}: {ctype}"
            docs = sse_chunks(text)
            assert docs and text.rstrip().endswith("data: [DONE]"), f"{name}: {text[-200:]}"
        else:
            docs = [json.loads(text)]
        v = validators(schema)
        for i, doc in enumerate(docs):
            for err in v.iter_errors(doc):
                where = "/".join(map(str, err.absolute_path))
                if streamed and where.endswith("finish_reason") and err.instance is None:
                    continue
                violations.append(f"{name} [{i}] at {where}: {err.message[:200]}")
    assert not violations, "\n".join(violations)


def test_stream_finish_reason_is_null_until_the_last_choice_chunk(gateway):
    """Beyond the schema, as OpenAI streams: `finish_reason` is null on every
    chunk but the last one carrying a choice."""
    _, _, text = request(gateway, "POST", "/v1/chat/completions",
                         {"model": "test-model", "messages": MESSAGES, "stream": True})
    chunks = sse_chunks(text)
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "stop" and all(f is None for f in finishes[:-1])


def test_bounded_schemathesis_run(gateway):
    """Schemathesis (positive mode, fixed seed) over createChatCompletion,
    createCompletion, listModels and retrieveModel: no server error, no
    answer outside its documented schema (the document's `nullable` and
    undocumented 4xx are its known quirks: status conformance is not
    checked), and every 4xx names its cause."""
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
           "PYTHONPATH": str(pathlib.Path(__file__).parent)}
    ops = ["createChatCompletion", "createCompletion", "listModels", "retrieveModel"]
    cmd = [str(harness.ROOT / ".venv" / "bin" / "schemathesis"), "run", str(SPEC),
           "--url", f"http://{gateway}/v1", "--mode", "positive", "--max-examples", "100",
           "--phases", "examples,fuzzing", "--seed", "20261123", "--no-color",
           "--generation-database", "none", "--continue-on-failure", "--workers", "1",
           "--checks", "not_a_server_error,response_schema_conformance,error_names_its_cause"]
    for op in ops:
        cmd += ["--include-operation-id", op]
    # Schemathesis keeps state in its working directory: not the repository.
    with tempfile.TemporaryDirectory() as work:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=work)
    summary = re.search(r"(\d+) generated, (\d+) passed(.*)", r.stdout)
    assert r.returncode == 0 and summary, r.stdout[-8000:] + r.stderr[-2000:]
    generated, passed = int(summary.group(1)), int(summary.group(2))
    print(f"schemathesis: {generated} cases generated, {passed} passed")
    assert generated >= 200 and passed == generated, r.stdout[-8000:]


# --- tito's own document (docs/openapi.yaml, served at /openapi.json) ---

OWN_DOC = harness.ROOT / "docs" / "openapi.yaml"
# One token for every role, so that each operation is called with its role
# and `ignored_auth` can check that each guarded one refuses a call without.
OWN_TOKEN = "conformance-token-0001"
# Operations left out of the fuzz: they change the fleet itself, so later
# cases would test a different gateway (or reach outside this machine).
OWN_EXCLUDED = {
    "addBackend": "takes any URL: the gateway would connect (health checks included) wherever it names",
    "removeBackend": "can remove the only backend: every later call is then a 503",
    "sleepBackends": "pauses admission until a wake-up: later calls wait",
    "updateWeights": "drains and fans out to the backends; a 502 there is the backend's own answer",
    "beginWeightUpdate": "pauses admission until the commit",
    "commitWeightUpdate": "fans out to the backends and sets the weight version",
}
OWN_CHECKS = [
    "not_a_server_error", "status_code_conformance", "content_type_conformance",
    "response_headers_conformance", "response_schema_conformance", "ignored_auth",
    "unsupported_method", "allow_header_conformance", "error_in_openai_shape",
]


@contextlib.contextmanager
def guarded_gateway():
    """`tito serve` (a token for every role) in front of the mock backend;
    yields its `addr`, `log` lines, `process` and the `mock_addr`. Its output
    is read all along (a long run fills a pipe left unread) and kept, to look
    for panics."""
    if not (TOKENIZER / "tokenizer.json").exists():
        raise RuntimeError("missing .cache/tokenizers/qwen3: run scripts/fetch-tokenizers.sh")
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    reply = tok.encode("Hello! 你好 🎉", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    harness.build()
    auth = "[auth]\n" + "".join(
        f'{role} = ["{OWN_TOKEN}"]\n' for role in ("api_keys", "trainer_tokens", "admin_tokens"))
    mock, mock_addr = harness.start_mock(reply)
    try:
        tito, addr = harness.start_tito(TOKENIZER, f"http://{mock_addr}", extra_config=auth)
    except BaseException:
        mock.terminate()
        mock.wait(timeout=30)
        raise
    log = []
    reader = threading.Thread(target=lambda: log.extend(tito.stdout), daemon=True)
    reader.start()
    try:
        yield types.SimpleNamespace(addr=addr, log=log, process=tito, mock_addr=mock_addr)
    finally:
        for p in (tito, mock):
            p.terminate()
            p.wait(timeout=30)
        reader.join(timeout=30)


def fuzz_own_document(addr, max_examples, seed, phases="examples,fuzzing", mode="all"):
    """Schemathesis over every operation of tito's own document (as served)
    except OWN_EXCLUDED: (exit code, output, generated, passed)."""
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
           "PYTHONPATH": str(pathlib.Path(__file__).parent)}
    cmd = [str(harness.ROOT / ".venv" / "bin" / "schemathesis"), "run",
           f"http://{addr}/openapi.json", "--url", f"http://{addr}", "--mode", mode,
           "--max-examples", str(max_examples), "--phases", phases, "--seed", str(seed),
           "--no-color", "--generation-database", "none", "--continue-on-failure",
           "--workers", "1", "--header", f"Authorization: Bearer {OWN_TOKEN}",
           "--checks", ",".join(OWN_CHECKS)]
    for op in OWN_EXCLUDED:
        cmd += ["--exclude-operation-id", op]
    with tempfile.TemporaryDirectory() as work:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=work)
    out = r.stdout + r.stderr
    # The summary's line: "N generated, N passed" or "N generated, N found ...".
    m = re.search(r"Test cases:\s*\n\s*(.*)", out)
    line = m.group(1) if m else ""
    generated, passed = (re.search(rf"(\d+) {w}\b", line) for w in ("generated", "passed"))
    return (r.returncode, out, int(generated.group(1)) if generated else 0,
            int(passed.group(1)) if passed else 0)


def alive(addr):
    status, _, text = request(addr, "GET", "/health")
    return status == 200 and text == "ok"


def panics(log):
    return [line for line in log if "panicked" in line or " ERROR " in line]


def test_bounded_schemathesis_run_against_titos_own_document():
    """tito's own document, as served, fuzzed with schemathesis (positive and
    negative data, fixed seed, every operation but the fleet-changing ones):
    0 server errors, every answer in its documented status, content type,
    headers and schema (SSE events included), every error in OpenAI's exact
    shape, every guarded route refusing a call without its token, no panic
    or ERROR in the log, the process alive afterwards."""
    with guarded_gateway() as g:
        addr, log, tito = g.addr, g.log, g.process
        status, ctype, text = request(addr, "GET", "/openapi.json")
        assert status == 200 and ctype.startswith("application/json"), (status, ctype)
        # What Rust's YAML reader serves is what a YAML 1.1 reader sees.
        assert json.loads(text) == yaml.safe_load(OWN_DOC.read_text())
        started = time.monotonic()
        rc, out, generated, passed = fuzz_own_document(addr, max_examples=10, seed=20261123)
        took = time.monotonic() - started
        print(f"schemathesis on docs/openapi.yaml: {generated} cases generated, {passed} passed, {took:.0f} s")
        assert rc == 0 and generated >= 250 and passed == generated, out[-8000:]
        assert tito.poll() is None and alive(addr), "".join(log[-50:])
    assert not panics(log), "".join(panics(log))[:4000]


def call(addr, method, path, body=None):
    """(status, headers, JSON body or None) of a call with the token."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{addr}{path}", data=data, method=method)
    req.add_header("content-type", "application/json")
    req.add_header("authorization", f"Bearer {OWN_TOKEN}")
    try:
        with urllib.request.urlopen(req) as r:
            status, headers, text = r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        status, headers, text = e.code, e.headers, e.read().decode()
    try:
        return status, headers, json.loads(text)
    except ValueError:
        return status, headers, None


def documented(doc, method, template, status, body):
    """Violations of the schema `doc` gives for this answer."""
    op = doc["paths"][template][method.lower()]
    resp = op["responses"].get(str(status))
    if resp is None:
        return [f"{method} {template}: status {status} is not documented"]
    if "$ref" in resp:
        resp = doc["components"]["responses"][resp["$ref"].rsplit("/", 1)[1]]
    schema = resp["content"]["application/json"]["schema"]
    registry = Registry().with_resource("urn:tito", Resource(contents=doc, specification=DRAFT202012))
    schema = json.loads(json.dumps(schema).replace('"#/components/', '"urn:tito#/components/'))
    v = Draft202012Validator(schema, registry=registry)
    return [f"{method} {template} {status} at {'/'.join(map(str, e.absolute_path))}: {e.message[:200]}"
            for e in v.iter_errors(body)]


def test_fleet_operations_answer_as_documented():
    """The operations the fuzz leaves out, each called in an order that
    keeps the fleet working, answer with a documented status and schema:
    add and remove a backend (the same mock under another name), sleep and
    wake up, tag and reload weights, and an export page acknowledged."""
    with guarded_gateway() as g:
        _, _, doc = call(g.addr, "GET", "/openapi.json")
        mock = f"http://{g.mock_addr}"
        steps = [
            ("POST", "/admin/backends", "/admin/backends", {"url": mock, "kind": "vllm", "name": "second"}),
            ("DELETE", "/admin/backends/second", "/admin/backends/{id}", None),
            ("POST", "/admin/sleep?level=1", "/admin/sleep", None),
            ("POST", "/admin/wake_up", "/admin/wake_up", None),
            ("POST", "/admin/weights", "/admin/weights", {"version": "step-1"}),
            ("POST", "/admin/weights", "/admin/weights", {"version": "step-2", "path": "/tmp/w"}),
            ("POST", "/t/fleet-1/v1/chat/completions", "/t/{tid}/v1/chat/completions",
             {"messages": [{"role": "user", "content": "hi"}]}),
            ("POST", "/v1/trajectories/fleet-1/finish", "/v1/trajectories/{id}/finish", None),
            ("GET", "/admin/backends", "/admin/backends", None),
        ]
        # The two-step weight update, once it is routed (another branch): a
        # GET there is a 405 then (and does nothing), a 404 now.
        if call(g.addr, "GET", "/admin/weights/begin")[0] == 405:
            steps += [
                ("POST", "/admin/weights/begin", "/admin/weights/begin", {}),
                ("POST", "/admin/weights/commit", "/admin/weights/commit", {"version": "step-3"}),
            ]
        wrong = []
        for method, path, template, body in steps:
            status, _, answer = call(g.addr, method, path, body)
            assert status < 500, f"{method} {path}: {status} {answer}"
            wrong += documented(doc, method, template, status, answer)
        status, headers, _ = call(g.addr, "GET", "/v1/export?consumer=trainer-a")
        cursor = headers.get("x-export-cursor")
        assert status == 200 and cursor and headers.get("x-export-trajectories") == "1", (status, dict(headers))
        ack = {"consumer": "trainer-a", "cursor": cursor}
        for _ in range(2):  # twice: the second is `already_acknowledged`
            status, _, answer = call(g.addr, "POST", "/v1/export/ack", ack)
            wrong += documented(doc, "POST", "/v1/export/ack", status, answer)
        assert answer["already_acknowledged"] is True, answer
        _, _, fleet = call(g.addr, "GET", "/admin/backends")
        assert fleet["weight_version"] == ("step-3" if len(steps) > 9 else "step-2"), fleet
        assert [b["name"] for b in fleet["backends"]] == [mock] and not fleet["paused"], fleet
        assert not wrong, "\n".join(wrong)
    assert not panics(g.log), "".join(panics(g.log))[:4000]


def main():
    """scripts/fuzz.sh: a longer run (more cases per operation, the
    coverage phase too) against a fresh gateway."""
    import argparse
    import random

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--max-examples", type=int, default=200, help="cases per operation and mode")
    p.add_argument("--seed", type=int, default=random.randrange(1 << 31))
    p.add_argument("--phases", default="examples,coverage,fuzzing")
    p.add_argument("--mode", default="all", choices=["positive", "negative", "all"])
    a = p.parse_args()
    with guarded_gateway() as g:
        addr, log, tito = g.addr, g.log, g.process
        started = time.monotonic()
        rc, out, generated, passed = fuzz_own_document(addr, a.max_examples, a.seed, a.phases, a.mode)
        print(out)
        ok = rc == 0 and 0 < passed == generated and tito.poll() is None and alive(addr)
    bad = panics(log)
    print("".join(bad)[:8000])
    summary = re.search(r"Test cases:\s*\n\s*(.*)", out)
    print(f"fuzz: seed {a.seed}, {summary.group(1) if summary else 'no summary'}, {len(bad)} panic/ERROR "
          f"log lines, {time.monotonic() - started:.0f} s: {'ok' if ok and not bad else 'FAILED'}")
    return 0 if ok and not bad else 1


if __name__ == "__main__":
    raise SystemExit(main())
