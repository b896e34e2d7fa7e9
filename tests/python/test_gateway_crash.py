"""`kill -9` of the real gateway under concurrent load: after a restart on
the same SQLite store, every call whose response reached a client is in the
store, and the store opens cleanly."""

import concurrent.futures
import json
import os
import pathlib
import signal
import tempfile
import threading
import urllib.request

import harness

REPLY = [72, 105, 33]


def serve(config_path):
    exe = harness.TARGET / "debug" / "tito"
    return harness._start(
        [str(exe), "serve", "--config", str(config_path)],
        r"tito listening addr=(\S+)",
        env={"RUST_LOG": "info", "NO_COLOR": "1"},
    )


def call(addr, i):
    body = json.dumps({"messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 8}).encode()
    req = urllib.request.Request(
        f"http://{addr}/t/crash-{i}/v1/chat/completions",
        data=body,
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
        json.load(r)
    return i


def test_acknowledged_calls_survive_kill_9():
    harness.build()
    tok_dir = harness.ROOT / ".cache" / "tokenizers" / "qwen3"
    assert (tok_dir / "tokenizer.json").exists(), "run scripts/fetch-tokenizers.sh"
    mock, mock_addr = harness.start_mock(REPLY)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="tito-crash-"))
    cfg = tmp / "config.toml"
    cfg.write_text(
        f"""
[server]
listen = "127.0.0.1:0"
[model]
name = "m"
tokenizer = "{tok_dir}"
[[backends]]
url = "http://{mock_addr}"
kind = "vllm"
[store]
url = "sqlite://{tmp}/spans.db"
"""
    )
    tito, addr = serve(cfg)
    acked, lock = [], threading.Lock()
    killed = threading.Event()

    def worker(i):
        try:
            call(addr, i)
        except Exception:
            return
        with lock:
            acked.append(i)
            if len(acked) == 150 and not killed.is_set():
                killed.set()
                os.kill(tito.pid, signal.SIGKILL)

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(worker, range(400)))
        tito.wait(timeout=30)
        assert killed.is_set(), "the gateway was killed mid-load"
        assert len(acked) >= 150
        tito, addr = serve(cfg)
        for i in acked:
            with urllib.request.urlopen(f"http://{addr}/v1/trajectories/crash-{i}") as r:
                t = json.load(r)
            assert len(t["calls"]) == 1
            assert t["calls"][0]["sampled_ids"] == REPLY
    finally:
        for p in (tito, mock):
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=30)
