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


def start_tito(tokenizer_dir, backend_url, model="test-model", extra_config=""):
    """`extra_config`: TOML appended to the generated config (e.g. an
    `[auth]` table)."""
    tmp = tempfile.mkdtemp(prefix="tito-test-")
    cfg = pathlib.Path(tmp) / "config.toml"
    cfg.write_text(
        f"""
[server]
listen = "127.0.0.1:0"
[model]
name = "{model}"
tokenizer = "{tokenizer_dir}"
[[backends]]
url = "{backend_url}"
kind = "vllm"
[store]
url = "sqlite://{tmp}/spans.db"
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
def mock_gateway(tokenizer_dir, reply_ids, script=None, structured_reply_ids=None, extra_config=""):
    """`tito serve` in front of a mock backend (see `start_mock`); yields
    tito's address and stops both on exit. `extra_config` as for
    `start_tito`."""
    build()
    mock, mock_addr = start_mock(reply_ids, script=script, structured_reply_ids=structured_reply_ids)
    try:
        tito, addr = start_tito(tokenizer_dir, f"http://{mock_addr}", extra_config=extra_config)
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

