"""Starts real processes for the Python tests: the mock backend example and
the `tito serve` binary (built with cargo if needed), each on a port chosen
by the OS, and reads the bound address from their output."""

import contextlib
import json
import os
import pathlib
import re
import subprocess
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
TARGET = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))


def build():
    subprocess.run(
        ["cargo", "build", "--quiet", "--bin", "tito", "--example", "mock_backend"],
        cwd=ROOT,
        check=True,
    )


def _start(cmd, pattern, env=None):
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
    )
    seen = []
    for line in proc.stdout:
        seen.append(line)
        m = re.search(pattern, line)
        if m:
            return proc, m.group(1)
    proc.wait()
    raise RuntimeError(f"{cmd[0]} exited before printing its address:\n{''.join(seen)}")


def start_mock(reply_ids, script=None, structured_reply_ids=None):
    """The mock answers the requests with `script` (a list of id lists) in
    order, then with `reply_ids`; a request constrained with
    `structured_outputs` gets `structured_reply_ids` when given."""
    exe = TARGET / "debug" / "examples" / "mock_backend"
    cmd = [str(exe), "--reply-ids", ",".join(map(str, reply_ids))]
    if structured_reply_ids is not None:
        cmd += ["--structured-reply-ids", ",".join(map(str, structured_reply_ids))]
    if script is not None:
        path = pathlib.Path(tempfile.mkdtemp(prefix="tito-mock-")) / "script.json"
        path.write_text(json.dumps(script))
        cmd += ["--script", str(path)]
    return _start(cmd, r"listening on (\S+)")


def start_tito(tokenizer_dir, backend_url, model="test-model", extra_config="", model_extra="",
               store_url=None, listen="127.0.0.1:0", kind="vllm"):
    """`extra_config`: TOML appended to the generated config (e.g. an
    `[auth]` table); `model_extra`: lines added to its `[model]` table;
    `backend_url`: one URL or a list, of backends of `kind`; `store_url`:
    default a fresh SQLite file."""
    tmp = tempfile.mkdtemp(prefix="tito-test-")
    cfg = pathlib.Path(tmp) / "config.toml"
    urls = [backend_url] if isinstance(backend_url, str) else backend_url
    backends = "".join(f'[[backends]]\nurl = "{u}"\nkind = "{kind}"\n' for u in urls)
    cfg.write_text(
        f"""
[server]
listen = "{listen}"
[model]
name = "{model}"
tokenizer = "{tokenizer_dir}"
{model_extra}
{backends}
[store]
url = "{store_url or f'sqlite://{tmp}/spans.db'}"
{extra_config}
"""
    )
    exe = TARGET / "debug" / "tito"
    # ANSI colours off so the address can be read from the log line.
    return _start(
        [str(exe), "serve", "--config", str(cfg)],
        r"tito listening addr=(\S+)",
        env={"RUST_LOG": "info", "NO_COLOR": "1"},
    )


def start_tito_with_default_config():
    """`tito serve` on the repository's config.toml (bundled engine, GGUF
    model), moved to a free port and a temporary store."""
    text = (ROOT / "config.toml").read_text()
    tmp = tempfile.mkdtemp(prefix="tito-test-")
    text = text.replace('listen = "127.0.0.1:8000"', 'listen = "127.0.0.1:0"')
    text = text.replace('url = "sqlite://tito-data/spans.db"', f'url = "sqlite://{tmp}/spans.db"')
    cfg = pathlib.Path(tmp) / "config.toml"
    cfg.write_text(text)
    exe = TARGET / "debug" / "tito"
    return _start(
        [str(exe), "serve", "--config", str(cfg)],
        r"tito listening addr=(\S+)",
        env={"RUST_LOG": "info", "NO_COLOR": "1"},
    )


@contextlib.contextmanager
def mock_gateway(tokenizer_dir, reply_ids, script=None, structured_reply_ids=None, extra_config="",
                 model_extra=""):
    """`tito serve` in front of a mock backend (see `start_mock`); yields
    tito's address and stops both on exit. `extra_config` and
    `model_extra` as for `start_tito`."""
    build()
    mock, mock_addr = start_mock(reply_ids, script=script, structured_reply_ids=structured_reply_ids)
    try:
        tito, addr = start_tito(tokenizer_dir, f"http://{mock_addr}", extra_config=extra_config,
                                model_extra=model_extra)
    except BaseException:
        mock.terminate()
        mock.wait(timeout=30)
        raise
    try:
        yield addr
    finally:
        for p in (tito, mock):
            p.terminate()
            p.wait(timeout=30)



def chromium_path():
    """The system chromium (Debian's `chromium`, installed by
    scripts/setup-system.sh), or None."""
    import shutil

    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Browser:
    """Headless chromium driven over the DevTools protocol: one page, to
    navigate, evaluate JavaScript in, resize and screenshot."""

    def __init__(self, executable):
        import time
        import urllib.request

        from websockets.sync.client import connect

        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="tito-chromium-"))
        self.log = open(self.dir / "stderr.log", "w+")
        self.proc = subprocess.Popen(
            [
                executable, "--headless", "--no-sandbox", "--disable-gpu",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--remote-debugging-port=0", f"--user-data-dir={self.dir / 'profile'}",
                "--window-size=1280,900", "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.log,
        )
        deadline = time.monotonic() + 30
        ws = None
        while ws is None:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError(f"chromium did not start:\n{(self.dir / 'stderr.log').read_text()}")
            m = re.search(r"DevTools listening on ws://([^/\s]+)/", (self.dir / "stderr.log").read_text())
            if m:
                ws = m.group(1)
            else:
                time.sleep(0.1)
        with urllib.request.urlopen(f"http://{ws}/json/list") as r:
            pages = [t for t in json.load(r) if t["type"] == "page"]
        self.ws = connect(pages[0]["webSocketDebuggerUrl"], max_size=None).__enter__()
        self.next_id = 0
        self.send("Page.enable")
        self.send("Runtime.enable")

    def send(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def eval(self, expression):
        """The value of a JavaScript expression (promises awaited)."""
        r = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def goto(self, url):
        """Navigates and waits for the new document to load."""
        self.eval("window.__titoOld = true")
        self.send("Page.navigate", url=url)
        self.wait_for("!window.__titoOld && document.readyState === 'complete'")

    def wait_for(self, expression, timeout=10.0):
        """Polls until `expression` is truthy; returns its value."""
        import time

        deadline = time.monotonic() + timeout
        while True:
            try:
                # A DOM node does not come back by value: true for it.
                value = self.eval(f"(() => {{ const v = ({expression}); return v instanceof Node || v; }})()")
            except RuntimeError:
                value = None  # the page is still loading
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"not true after {timeout} s: {expression}")
            time.sleep(0.05)

    def size(self, width, height, mobile=False):
        self.send(
            "Emulation.setDeviceMetricsOverride",
            width=width, height=height, deviceScaleFactor=1, mobile=mobile,
        )

    def screenshot(self, path):
        import base64

        size = self.send("Page.getLayoutMetrics")["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 6000), "scale": 1}
        shot = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True, clip=clip)
        pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(path).write_bytes(base64.b64decode(shot["data"]))

    def close(self):
        try:
            if getattr(self, "ws", None) is not None:
                self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.log.close()


QWEN3 = ROOT / ".cache" / "tokenizers" / "qwen3"


def qwen3_tokenizer():
    """The Qwen3 tokenizer fixture (transformers), after building the binaries."""
    import pytest
    from transformers import AutoTokenizer

    if not (QWEN3 / "tokenizer.json").exists():
        pytest.fail("missing .cache/tokenizers/qwen3: run scripts/fetch-tokenizers.sh")
    build()
    return AutoTokenizer.from_pretrained(str(QWEN3))


# --- Exact trajectories driven by agent clients ---


def pieces(tok, parts):
    """Token ids of `parts` tokenized one by one: text the model could have
    sampled, but not the tokenizer's own (canonical) encoding of it."""
    return [i for p in parts for i in tok.encode(p, add_special_tokens=False)]


def sampled(tok, parts):
    """A scripted reply: `parts` tokenized one by one, then `<|im_end|>`.
    Fails unless the ids differ from the canonical encoding of their text,
    so that a gateway re-tokenizing the history could not pass."""
    ids = pieces(tok, parts)
    assert tok.encode(tok.decode(ids), add_special_tokens=False) != ids, f"canonical: {parts}"
    return ids + [tok.convert_tokens_to_ids("<|im_end|>")]


def tool_call_text(name, arguments):
    """A hermes tool call's text (Qwen3's format)."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def http_json(addr, path):
    import urllib.request

    with urllib.request.urlopen(f"http://{addr}{path}") as r:
        return json.load(r)


def export_rows(addr, tid=None):
    """The trainer export's rows (`layout=trajectory`), of `tid` if given."""
    import urllib.request

    with urllib.request.urlopen(f"http://{addr}/v1/export?format=jsonl&layout=trajectory") as r:
        rows = [json.loads(line) for line in r.read().decode().splitlines()]
    return [r for r in rows if tid is None or r["trajectory_id"] == tid]


def mock_logprobs(n):
    """The mock backend's logprob of the i-th token of each reply."""
    return [-0.5 - i / 100 for i in range(n)]


def assert_one_exact_sample(addr, tid, script, api):
    """Trajectory `tid` was made of len(script) calls through surface `api`
    (`responses`, `messages`), answered in order with the replies `script`:
    its export is one sample in which every call's sampled ids sit verbatim
    at its call offset, the mask is 1 exactly on them, and the logprobs are
    the mock's there and null elsewhere. Returns the row."""
    import pytest

    rows = export_rows(addr, tid)
    assert len(rows) == 1, f"one sample for the whole conversation, got {len(rows)}"
    row = rows[0]
    resp, mask, lps = row["response_ids"], row["response_mask"], row["response_logprobs"]
    assert row["num_turns"] == len(script)
    offsets = row["call_offsets"]
    assert len(offsets) == len(script)
    assert resp[: len(script[0])] == script[0] and offsets[0] == 0
    want_mask = [0] * len(resp)
    want_lps = [None] * len(resp)
    for off, reply in zip(offsets, script):
        assert resp[off : off + len(reply)] == reply, "sampled ids verbatim in the next prompts"
        want_mask[off : off + len(reply)] = [1] * len(reply)
        want_lps[off : off + len(reply)] = mock_logprobs(len(reply))
    assert mask == want_mask
    assert [lp is None for lp in lps] == [lp is None for lp in want_lps]
    assert [lp for lp in lps if lp is not None] == pytest.approx(
        [lp for lp in want_lps if lp is not None], abs=1e-6)
    t = http_json(addr, f"/v1/trajectories/{tid}")
    assert [c["api"] for c in t["calls"]] == [api] * len(script)
    assert [c["sampled_ids"] for c in t["calls"]] == script
    calls = t["calls"]
    assert [c["parent_call"] for c in calls[1:]] == [c["call_index"] for c in calls[:-1]]
    return row


class CuttingProxy:
    """A loopback HTTP/1.1 relay in front of tito at `upstream`, standing
    for a network that loses answers: a request whose
    `x-stainless-retry-count` is `0` (an SDK's first attempt) is sent to
    tito and answered there in full, then its connection is reset before a
    byte of the answer reaches the client, which must retry. Every other
    request is relayed, its answer given back whole, with the headers in
    `strip` removed on the way to tito. `cut`: the answers lost; `relayed`:
    the headers of the relayed requests as the client sent them."""

    def __init__(self, upstream, strip=()):
        import socketserver
        import threading

        self.upstream = upstream
        self.strip = {h.lower() for h in strip}
        self.cut = 0
        self.relayed = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                proxy._serve(self.request)

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.addr = "%s:%d" % self.server.server_address
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=30)

    @staticmethod
    def _read_request(f):
        line = f.readline()
        if not line:
            return None
        method, target, _ = line.decode("latin-1").split(" ", 2)
        headers = []
        while True:
            h = f.readline().decode("latin-1")
            if h in ("\r\n", "\n", ""):
                break
            name, value = h.split(":", 1)
            headers.append((name.strip(), value.strip()))
        length = next((int(v) for k, v in headers if k.lower() == "content-length"), 0)
        return method, target, headers, f.read(length) if length else b""

    def _serve(self, sock):
        import http.client
        import socket
        import struct

        f = sock.makefile("rb")
        upstream = http.client.HTTPConnection(self.upstream, timeout=120)
        try:
            while True:
                req = self._read_request(f)
                if req is None:
                    return
                method, target, headers, body = req
                first = any(k.lower() == "x-stainless-retry-count" and v == "0" for k, v in headers)
                hop = {"host", "connection", "keep-alive", "content-length", "transfer-encoding"}
                sent = {k: v for k, v in headers
                        if k.lower() not in hop and (first or k.lower() not in self.strip)}
                upstream.request(method, target, body=body, headers=sent)
                resp = upstream.getresponse()
                data = resp.read()
                if first:
                    with self.lock:
                        self.cut += 1
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                with self.lock:
                    self.relayed.append({k.lower(): v for k, v in headers})
                out = [f"HTTP/1.1 {resp.status} {resp.reason}\r\n"]
                out += [f"{k}: {v}\r\n" for k, v in resp.getheaders()
                        if k.lower() not in hop]
                out.append(f"content-length: {len(data)}\r\n\r\n")
                sock.sendall("".join(out).encode("latin-1") + data)
        finally:
            upstream.close()
            f.close()
