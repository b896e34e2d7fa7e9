"""Two `tito serve` replicas on one PostgreSQL store behind the shipped
nginx front balancer (docker/nginx.conf): 50 concurrent 3-turn trajectories
keep exact history; one replica is killed with SIGKILL mid-run and its
trajectories continue on the other with no acknowledged call lost; the
export read from either replica is identical.

Needs the throwaway cluster scripts/test.sh starts (TITO_TEST_POSTGRES) and
Debian's nginx (scripts/setup-system.sh --test)."""

import concurrent.futures
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import urllib.error
import urllib.request
import uuid

import harness

# "Hello there." as the tokenizer splits it, so a fresh render of the
# history equals the exact tokens (no drift to explain).
REPLY = [9707, 1052, 13]
TRAJECTORIES = 50
TURNS = 3
KILL_AFTER = 60
NGINX = "/usr/sbin/nginx"


def postgres_database():
    base = os.environ.get("TITO_TEST_POSTGRES")
    assert base, "TITO_TEST_POSTGRES is unset: run the tests with scripts/test.sh"
    name = f"tito_replicas_{uuid.uuid4().hex[:12]}"
    subprocess.run(["psql", f"{base}/postgres", "-qc", f"CREATE DATABASE {name}"], check=True)
    return f"{base}/{name}"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_nginx(replicas):
    """The shipped config with its two upstream servers pointed at
    `replicas` and its listener on a free loopback port. nginx, daemonized,
    returns only once its socket is bound; it is stopped by its PID."""
    assert os.access(NGINX, os.X_OK), "nginx missing: run scripts/setup-system.sh --test"
    text = (harness.ROOT / "docker" / "nginx.conf").read_text()
    for n, addr in enumerate(replicas, start=1):
        text, count = re.subn(rf"server tito-{n}:8000", f"server {addr}", text)
        assert count == 1, f"docker/nginx.conf has no `server tito-{n}:8000` line"
    port = free_port()
    text, count = re.subn(r"listen 8000;", f"listen 127.0.0.1:{port};", text)
    assert count == 1
    prefix = pathlib.Path(tempfile.mkdtemp(prefix="tito-nginx-"))
    text, count = re.subn(r"access_log /dev/stdout tito;",
                          f"access_log {prefix}/logs/access.log tito;", text)
    assert count == 1
    (prefix / "logs").mkdir()
    (prefix / "nginx.conf").write_text(text)
    user = "user root;" if os.getuid() == 0 else ""
    subprocess.run(
        [NGINX, "-p", str(prefix), "-c", str(prefix / "nginx.conf"),
         "-g", f"{user} pid {prefix}/nginx.pid; error_log {prefix}/logs/error.log;"],
        check=True,
    )
    pid = int((prefix / "nginx.pid").read_text())
    return pid, f"127.0.0.1:{port}", prefix


def upstreams_by_trajectory(access_log):
    """trajectory id -> the replicas that answered its calls, in order."""
    seen = {}
    for line in access_log.read_text().splitlines():
        m = re.search(r"trajectory=(\S+) upstream=(.+) status=(\d+)", line)
        if m:
            # `a, b`: nginx tried `a`, then `b`; the last one answered.
            seen.setdefault(m.group(1), []).append(m.group(2).split(", ")[-1])
    return seen


def post(addr, tid, messages, turn):
    body = json.dumps({"messages": messages, "max_tokens": 8}).encode()
    req = urllib.request.Request(
        f"http://{addr}/t/{tid}/v1/chat/completions",
        data=body,
        headers={"content-type": "application/json", "Idempotency-Key": f"{tid}-{turn}"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200
        return json.load(r)


def get(addr, path):
    with urllib.request.urlopen(f"http://{addr}{path}", timeout=60) as r:
        return r.read()


def user_text(call, calls):
    """The last user message of the request a stored call answered."""
    request = call["request"]
    if request is None:
        request = next(c["request"] for c in calls if c["call_index"] == call["request_of"])
    return request["messages"][-1]["content"]


def test_two_replicas_behind_nginx_keep_exact_history_through_a_kill_9():
    harness.build()
    tok_dir = harness.ROOT / ".cache" / "tokenizers" / "qwen3"
    assert (tok_dir / "tokenizer.json").exists(), "run scripts/fetch-tokenizers.sh"
    store_url = postgres_database()
    mocks = [harness.start_mock(REPLY) for _ in range(2)]
    backends = [f"http://{addr}" for _, addr in mocks]
    procs = [p for p, _ in mocks]
    nginx_pid, nginx_dir = None, None
    try:
        a, a_addr = harness.start_tito(tok_dir, backends, store_url=store_url)
        b, b_addr = harness.start_tito(tok_dir, backends, store_url=store_url)
        procs += [a, b]
        nginx_pid, front, nginx_dir = start_nginx([a_addr, b_addr])
        access_log = nginx_dir / "logs" / "access.log"

        acked, lock = [], threading.Lock()
        killed = threading.Event()
        failures = []

        def agent(i):
            tid = f"rep-{i}"
            messages = []
            for turn in range(TURNS):
                messages.append({"role": "user", "content": f"turn {turn} of {tid}"})
                reply = None
                # The calls in flight on the killed replica fail once; the
                # client retries them (the next try goes to the other one).
                for _ in range(3):
                    try:
                        reply = post(front, tid, messages, turn)
                        break
                    except urllib.error.HTTPError as e:
                        # nginx's 502 for a call cut by the kill; anything
                        # else fails the test below.
                        with lock:
                            failures.append((tid, turn, killed.is_set(), f"HTTP {e.code}"))
                    except (urllib.error.URLError, ConnectionError) as e:
                        with lock:
                            failures.append((tid, turn, killed.is_set(), repr(e)))
                assert reply is not None, f"{tid} turn {turn} failed three times"
                messages.append(reply["choices"][0]["message"])
                with lock:
                    acked.append((tid, turn))
                    if len(acked) == KILL_AFTER and not killed.is_set():
                        killed.set()
                        os.kill(a.pid, signal.SIGKILL)
            return tid, messages

        with concurrent.futures.ThreadPoolExecutor(max_workers=TRAJECTORIES) as pool:
            conversations = dict(pool.map(agent, range(TRAJECTORIES)))
        a.wait(timeout=30)
        assert killed.is_set()
        assert len(acked) == TRAJECTORIES * TURNS
        # Only calls cut by the kill failed, and only the way a dead replica
        # makes them fail: nginx's 502 or a dropped connection.
        for tid, turn, after_kill, what in failures:
            assert after_kill, (tid, turn, what)
            assert not what.startswith("HTTP ") or what == "HTTP 502", (tid, turn, what)
        # Affinity: a trajectory stays on its replica while it is up, and the
        # killed replica's trajectories moved to the other one.
        moved = 0
        for tid, ups in upstreams_by_trajectory(access_log).items():
            first_b = ups.index(b_addr) if b_addr in ups else len(ups)
            assert all(u == a_addr for u in ups[:first_b]), (tid, ups)
            assert all(u == b_addr for u in ups[first_b:]), (tid, ups)
            moved += 0 < first_b < len(ups)
        assert moved > 0, "no trajectory continued on the other replica"
        print(f"{moved} trajectories moved to the surviving replica; "
              f"{len(failures)} tries failed and were retried")

        # The killed replica comes back on the same store: both read the same.
        a2, a2_addr = harness.start_tito(tok_dir, backends, store_url=store_url)
        procs.append(a2)
        served_by = set()
        for tid, messages in conversations.items():
            t = json.loads(get(b_addr, f"/v1/trajectories/{tid}"))
            assert json.loads(get(a2_addr, f"/v1/trajectories/{tid}")) == t
            calls = {c["call_index"]: c for c in t["calls"]}
            # Exact history: the acknowledged turns are one parent chain of
            # calls, each continuing the previous one's exact tokens (no drift).
            leaves = [c for c in t["calls"] if user_text(c, t["calls"]) == f"turn {TURNS - 1} of {tid}"]
            chains = []
            for leaf in leaves:
                chain = [leaf]
                while chain[-1]["parent_call"] is not None:
                    chain.append(calls[chain[-1]["parent_call"]])
                chains.append(chain[::-1])
            full = [ch for ch in chains if len(ch) == TURNS]
            assert full, f"{tid}: no chain of {TURNS} turns in {sorted(calls)}"
            for turn, call in enumerate(full[0]):
                assert user_text(call, t["calls"]) == f"turn {turn} of {tid}"
                assert call["drift"] is None, (tid, turn, call["drift"])
                assert call["sampled_ids"] == REPLY
                assert call["response"]["content"] == messages[2 * turn + 1]["content"]
            served_by |= {c["backend"] for c in t["calls"]}
        # Each replica balances its own in-flight calls: both backends work.
        assert served_by == set(backends), served_by

        export = "/v1/export?format=jsonl&layout=per_call"
        assert get(a2_addr, export) == get(b_addr, export)
        assert get(b_addr, export).count(b"\n") >= TRAJECTORIES * TURNS
    finally:
        if nginx_pid:
            os.kill(nginx_pid, signal.SIGQUIT)
        if nginx_dir:
            shutil.rmtree(nginx_dir, ignore_errors=True)
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=30)
