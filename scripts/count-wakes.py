#!/usr/bin/env python3
"""Futex calls, context switches and wake-ups a request of `tito serve`, for
streamed chat calls at 1 concurrent (one keep-alive client), per binary.

Usage: scripts/count-wakes.py BINARY [BINARY ...]   (e.g. an A/B: A B A B)

Needs `perf` (with access to syscall tracepoints), the mock backend example
(`cargo build --example mock_backend`) and the Qwen3 tokenizer
(`scripts/fetch-tokenizers.sh`). Each binary serves on a fresh SQLite store
in front of one mock (a 20-token reply); 300 calls warm it up, then `perf
stat -p` counts over 2,000 calls. The client is Python, so req/s is the
client's pace as much as the gateway's: read the counts.
"""
import http.client
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
CALLS = 2000
EVENTS = "syscalls:sys_enter_futex,sched:sched_switch,sched:sched_wakeup"


def start(cmd, pattern, env=None):
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})})
    for line in proc.stdout:
        m = re.search(pattern, line)
        if m:
            return proc, m.group(1)
    raise SystemExit(f"{cmd[0]} exited before printing its address")


def call(conn, n):
    body = json.dumps({"model": "m", "stream": True, "max_tokens": 32,
                       "messages": [{"role": "user", "content": f"hello number {n}"}]})
    conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    if resp.status != 200:
        raise SystemExit(f"{resp.status}: {data[:200]!r}")


def main():
    reply = ",".join(str(i) for i in [*range(1000, 1019), 151645])
    mock, mock_addr = start([str(ROOT / "target/debug/examples/mock_backend"), "--reply-ids", reply],
                            r"listening on (\S+)")
    try:
        for binary in sys.argv[1:]:
            tmp = tempfile.mkdtemp(prefix="tito-wakes-")
            cfg = pathlib.Path(tmp) / "config.toml"
            cfg.write_text(
                f'[server]\nlisten = "127.0.0.1:0"\n'
                f'[model]\nname = "m"\ntokenizer = "{ROOT}/.cache/tokenizers/qwen3"\n'
                f'[[backends]]\nurl = "http://{mock_addr}"\nkind = "vllm"\n'
                f'[store]\nurl = "sqlite://{tmp}/spans.db"\n')
            tito, addr = start([binary, "serve", "--config", str(cfg)], r"tito listening addr=(\S+)",
                               {"RUST_LOG": "info", "NO_COLOR": "1"})
            try:
                host, port = addr.rsplit(":", 1)
                conn = http.client.HTTPConnection(host, int(port))
                for n in range(300):
                    call(conn, n)
                stat = subprocess.Popen(["perf", "stat", "-x,", "-e", EVENTS, "-p", str(tito.pid)],
                                        stderr=subprocess.PIPE, text=True)
                time.sleep(0.3)  # perf attaching; the counts are a ratio to CALLS
                started = time.time()
                for n in range(CALLS):
                    call(conn, 1000 + n)
                took = time.time() - started
                stat.send_signal(2)
                lines = stat.communicate()[1].strip().splitlines()
                counts = {ln.split(",")[2]: int(ln.split(",")[0]) for ln in lines if ln[:1].isdigit()}
                per = ", ".join(f"{k.split(':')[1]} {v / CALLS:.2f}" for k, v in counts.items())
                print(f"{binary}: {CALLS / took:.0f} req/s; a request: {per}", flush=True)
            finally:
                tito.terminate()
                tito.wait()
    finally:
        mock.terminate()


if __name__ == "__main__":
    main()
