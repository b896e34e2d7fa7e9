"""The `tito-rl` package (python/) against a real `tito serve` over the
scripted mock backend (real Qwen3 tokenizer): exactly-once batches across a
client restart, a batch whose step raised delivered again, a crashed
client's page after its lease, rewards / finish / metadata / verify, auth,
weight updates and fleet status, typed errors, the async client; the export
schema check; the optional-import guards; and `pip install ./python` into a
fresh venv. The framework integrations: test_trainer_integrations.py."""

import asyncio
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import types

import httpx
import numpy as np
import pyarrow as pa
import pytest
from openai import OpenAI

import harness
from tito_rl_support import MODEL, P, R, TOKENIZER, Replies, export_row, roll

import tito  # noqa: E402  (python/src, put on sys.path by tito_rl_support)


@pytest.fixture(scope="module")
def tok():
    return harness.qwen3_tokenizer()


# -- the client ----------------------------------------------------------------

def test_batches_exactly_once_across_restart_and_a_raising_step(tok):
    rep = Replies(tok)
    with harness.mock_gateway(TOKENIZER, rep.text("ok")) as addr:
        gw = f"http://{addr}"
        with tito.Client(gw) as setup:
            everything = roll(addr, setup, 10)
        opts = dict(layout="verl", batch_size=2, prompt_length=P, response_length=R)
        trained = []  # trajectory ids of steps that returned

        a = tito.Client(gw)
        failed = None
        with pytest.raises(RuntimeError, match="step failed"):
            for k, batch in enumerate(a.batches("ppo", **opts)):
                assert len(batch) == 2 and batch.trajectories == 2
                tensors, non_tensors = batch.to_verl()
                assert tensors["input_ids"].shape == (2, P + R)
                assert tensors["input_ids"].dtype == np.int64
                assert tensors["rm_scores"].sum(axis=1).tolist() == pytest.approx(
                    [everything.index(t) / 10 for t in non_tensors["trajectory_id"]])
                if k == 2:
                    failed = batch
                    raise RuntimeError("step failed")
                trained.extend(batch.trajectory_ids)
        assert failed is not None and not failed.acked
        assert len(trained) == 4

        # The same client delivers the raised batch again, first.
        it = a.batches("ppo", **opts)
        again = next(it)
        assert again.cursor == failed.cursor and again.trajectory_ids == failed.trajectory_ids
        trained.extend(again.trajectory_ids)
        fourth = next(it)  # the loop came back: the redelivered batch is acknowledged
        assert again.acked and again.ack_result["trajectories"] == 2
        assert not set(fourth.trajectory_ids) & set(trained)
        trained.extend(fourth.trajectory_ids)
        fourth.ack()  # a checkpoint, then the trainer stops mid-epoch
        assert fourth.ack_result["object"] == "export.ack"
        assert fourth.ack_result["trajectories"] == 2
        assert fourth.ack_result["already_acknowledged"] is False
        it.close()
        a.close()

        # A restarted trainer (a new client) reads only what is left.
        with tito.Client(gw) as b:
            rest = [t for batch in b.batches("ppo", **opts) for t in batch.trajectory_ids]
            assert list(b.batches("ppo", **opts)) == []
        trained.extend(rest)
        assert len(rest) == 2
        assert sorted(trained) == sorted(everything), "every trajectory trained on exactly once"

        # Another consumer name reads everything independently.
        with tito.Client(gw) as c:
            audit = [t for batch in c.batches("audit", layout="trajectory", batch_size=100)
                     for t in batch.trajectory_ids]
        assert sorted(audit) == sorted(everything)


def test_async_client_batches_weights_and_errors(tok):
    rep = Replies(tok)
    with harness.mock_gateway(TOKENIZER, rep.text("ok")) as addr:
        gw = f"http://{addr}"
        with tito.Client(gw) as setup:
            everything = roll(addr, setup, 4)

        async def main():
            trained, failed = [], None
            async with tito.AsyncClient(gw) as client:
                t = await client.new_trajectory("async-g", index=3)
                assert t.base_url == f"{gw}/g/async-g/t/{t.id}/v1"
                with pytest.raises(RuntimeError):
                    async for batch in client.batches("ppo", layout="trajectory", batch_size=3):
                        if failed is None:
                            failed = batch
                            raise RuntimeError("step failed")
                async for batch in client.batches("ppo", layout="trajectory", batch_size=3):
                    trained.append(batch.trajectory_ids)
                assert trained[0] == failed.trajectory_ids, "the raised batch comes first"
                async with client.weight_push("step-9") as begun:
                    assert begun["ok"] is True
                assert (await client.fleet())["weight_version"] == "step-9"
                with pytest.raises(tito.NotFoundError):
                    await client.group("no-such-group")
                assert await client.health() is True
            return [tid for ids in trained for tid in ids]

        trained = asyncio.run(main())
        assert sorted(trained) == sorted(everything)


def test_a_crashed_client_s_batch_comes_back_after_its_lease(tok):
    rep = Replies(tok)
    with harness.mock_gateway(TOKENIZER, rep.text("ok")) as addr:
        gw = f"http://{addr}"
        with tito.Client(gw) as setup:
            everything = roll(addr, setup, 3)
        opts = dict(layout="trajectory", batch_size=1, lease_s=1)
        crashed = tito.Client(gw)
        first = next(crashed.batches("grpo", **opts))  # its step never returns
        trained = []
        with tito.Client(gw) as restarted:
            trained += [t for b in restarted.batches("grpo", **opts) for t in b.trajectory_ids]
            if first.trajectory_ids[0] not in trained:
                # The lease held it; once the lease has ended it is served again.
                while time.time() * 1000 <= first.lease_expires_ms + 5:
                    time.sleep(0.05)
                trained += [t for b in restarted.batches("grpo", **opts)
                            for t in b.trajectory_ids]
        assert sorted(trained) == sorted(everything)
        with pytest.raises(tito.CursorExpiredError) as e:
            first.ack()
        assert e.value.status == 409 and e.value.code == "cursor_expired"
        crashed.close()


def test_rewards_finish_metadata_verify_and_typed_errors(tok):
    rep = Replies(tok)
    with harness.mock_gateway(TOKENIZER, rep.text("It is 42.")) as addr, \
            tito.Client(f"http://{addr}") as client:
        t = client.new_trajectory("gsm-1", data_source="gsm8k", index=12,
                                  extra_info={"answer": 42})
        assert t.base_url == f"http://{addr}/g/gsm-1/t/{t.id}/v1"
        assert t.id.startswith("traj-") and len(t.id) == 33
        sdk = OpenAI(base_url=t.base_url, api_key="unused")
        sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "17+25?"}])
        t.reward(0.5, extra={"acc": 1, "format": 0})
        t.finish()

        g = client.group("gsm-1")
        assert (g["size"], g["finished"], g["rewarded"], g["mean_reward"]) == (1, 1, 1, 0.5)
        [row] = t.samples()  # one trajectory's export (`trajectory=ID`)
        assert row["trajectory_id"] == t.id
        assert row["reward"] == 0.5 and row["reward_extra_info"] == {"acc": 1, "format": 0}
        assert (row["data_source"], row["index"], row["extra_info"]) == ("gsm8k", 12, {"answer": 42})
        assert row["group"] == "gsm-1" and row["num_turns"] == 1
        assert client.trajectory(t.id)["status"] == "finished"

        checked = t.verify(threshold=0.05)
        assert checked["object"] == "trajectory.verify"
        assert checked["samples"][0]["compared"] == sum(row["response_mask"])
        assert checked["samples"][0]["max_abs_diff"] == 0

        # Typed errors carry tito's error body.
        with pytest.raises(tito.ConflictError) as e:
            client.metadata(t.id, group="another-group")
        assert e.value.status == 409 and e.value.body["error"]["message"] == e.value.message
        with pytest.raises(tito.NotFoundError) as e:
            client.samples("no-such-trajectory")
        assert "no-such-trajectory" in e.value.message
        # The gateway names the export schema it writes, and the package reads it.
        page = httpx.get(f"http://{addr}/v1/export", params={"trajectory": t.id})
        assert page.headers["x-export-schema-version"] in tito.EXPORT_SCHEMA_VERSIONS
        with pytest.raises(tito.NotFoundError) as e:
            client.trajectory("no-such-trajectory")
        assert e.value.status == 404 and "no-such-trajectory" in e.value.message
        assert e.value.type is not None
        with pytest.raises(tito.BadRequestError) as e:
            client.reward(t.id, 1.0, call=0, extra={"acc": 1})
        assert e.value.status == 400
        with pytest.raises(tito.APIError):
            client.export(layout="verl", prompt_length=131073, response_length=R)
        with pytest.raises(ValueError, match="prompt_length"):
            client.export(layout="verl")
        with pytest.raises(tito.BadRequestError) as e:
            client.export(layout="trajectory", group_sizes=3)
        assert "group_sizes" in e.value.message

        assert client.health() is True
        ready = client.ready()
        assert ready["ready"] is True and ready["backends_ready"] == 1
    with tito.Client(f"http://{addr}") as gone:
        assert gone.health() is False
        with pytest.raises(tito.TitoConnectionError):
            gone.group("gsm-1")


AUTH = """
[auth]
api_keys = ["agent-key-0001"]
trainer_tokens = ["trainer-token-0001"]
admin_tokens = ["admin-token-0001"]
"""


def test_auth_tokens_per_role(tok):
    rep = Replies(tok)
    with harness.mock_gateway(TOKENIZER, rep.text("ok"), extra_config=AUTH) as addr:
        gw = f"http://{addr}"
        with tito.Client(gw) as anonymous:
            with pytest.raises(tito.AuthenticationError) as e:
                anonymous.new_trajectory("g")
            assert e.value.status == 401
        with tito.Client(gw, token="trainer-token-0001", api_key="agent-key-0001") as trainer:
            t = trainer.new_trajectory("g")
            assert t.api_key == "agent-key-0001"
            OpenAI(base_url=t.base_url, api_key=t.api_key).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}])
            t.finish()
            assert [b.trajectory_ids for b in trainer.batches("c", layout="trajectory")] == [[t.id]]
            with pytest.raises(tito.AuthenticationError):
                trainer.fleet()
        with tito.Client(gw, token="trainer-token-0001", admin_token="admin-token-0001") as both:
            assert both.fleet()["weight_version"] is None


def test_update_weights_weight_push_and_fleet(tok):
    rep = Replies(tok)
    with harness.mock_gateway(TOKENIZER, rep.text("ok")) as addr, \
            tito.Client(f"http://{addr}") as client:
        def one_call(group):
            t = client.new_trajectory(group)
            OpenAI(base_url=t.base_url, api_key="unused").chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}])
            t.finish()
            return export_row(client, group)

        answer = client.update_weights("step-1")  # mode="wait"
        assert answer["ok"] is True and answer["weight_version"] == "step-1"
        assert client.fleet()["weight_version"] == "step-1"
        assert one_call("w1")["weight_versions"] == ["step-1"]

        with client.weight_push("step-2") as begun:
            assert begun["ok"] is True
            fleet = client.fleet()
            assert fleet["paused"] is True and "weight_update" in fleet["paused_for"]
        fleet = client.fleet()
        assert fleet["weight_version"] == "step-2" and fleet["paused"] is False
        assert one_call("w2")["weight_versions"] == ["step-2"]

        # A push that failed is not committed.
        with pytest.raises(RuntimeError, match="push failed"):
            with client.weight_push("step-3"):
                raise RuntimeError("push failed")
        assert client.fleet()["weight_version"] == "step-2"
        client.commit_weights("step-3")  # the trainer pushed again
        assert client.fleet()["weight_version"] == "step-3"
        with pytest.raises(tito.ConflictError):
            client.commit_weights("step-4")  # no begin

        # Other modes are passed to the gateway: `abort` runs as asked; a
        # `keep` push on a backend that cannot keep runs as `abort` there,
        # which the package warns about.
        assert client.update_weights("step-5", mode="abort")["mode"] == "abort"
        assert client.fleet()["weight_version"] == "step-5"
        with pytest.warns(tito.TitoWarning, match="keep"):
            with client.weight_push("step-6", mode="keep") as begun:
                assert begun["mode"] == "abort" and begun["asked_mode"] == "keep"
        assert client.fleet()["weight_version"] == "step-6"
        assert client.versions() == {1: "step-1", 2: "step-2", 3: "step-3", 4: "step-5",
                                     5: "step-6"}

        # A push that failed before changing any weights is called off: the
        # version stays, admission resumes, and there is nothing left to end.
        with pytest.raises(RuntimeError, match="push failed"):
            with client.weight_push("step-7"):
                raise RuntimeError("push failed")
        assert client.fleet()["paused"] is True
        called_off = client.cancel_weights()
        assert called_off["called_off"] is True and called_off["weight_version"] == "step-6"
        assert client.fleet()["paused"] is False
        assert one_call("w7")["weight_versions"] == ["step-6"]
        with pytest.raises(tito.ConflictError):
            client.cancel_weights()
        with pytest.raises(ValueError, match="mode"):
            client.update_weights("step-7", mode="later")


# -- schema, imports, install ------------------------------------------------------

def test_export_schema_check_names_both_versions(tok):
    from tito import schema

    good = pa.schema([(n, t) for n, t in schema.COLUMNS["verl"].items()])
    schema.check(good, "verl", None, "0.1.0")
    schema.check(good, "verl", "1", "0.1.0")
    with pytest.raises(tito.IncompatibleGatewayError) as e:
        schema.check(good, "verl", "2", "0.9.0")
    msg = str(e.value)
    assert "0.9.0" in msg and "schema 2" in msg and tito.__version__ in msg and "schema 1" in msg
    missing = pa.schema([f for f in good if f.name != "rollout_log_probs"])
    with pytest.raises(tito.IncompatibleGatewayError, match="rollout_log_probs"):
        schema.check(missing, "verl", None, "0.0.9")
    # The package is versioned with the gateway, and reads its export.
    cargo = (harness.ROOT / "Cargo.toml").read_text()
    assert f'version = "{tito.__version__}"' in cargo
    pyproject = (harness.ROOT / "python" / "pyproject.toml").read_text()
    assert f'version = "{tito.__version__}"' in pyproject
    rep = Replies(tok)
    with harness.mock_gateway(TOKENIZER, rep.text("ok")) as addr, \
            tito.Client(f"http://{addr}") as client:
        assert client.gateway_version() == tito.__version__
        roll(addr, client, 1)
        for layout in ("trajectory", "per_call", "verl"):
            table = client.export(layout=layout, prompt_length=P, response_length=R)
            assert table.num_rows == 1, layout


def test_imports_are_lazy_and_guarded(tok, monkeypatch):
    code = ("import json, sys, tito; print(json.dumps([m for m in ('torch', 'verl', 'slime', "
            "'areal', 'datasets', 'ray', 'langchain_core', 'openai') if m in sys.modules]))")
    env = {**os.environ, "PYTHONPATH": str(harness.ROOT / "python" / "src")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True)
    assert json.loads(out.stdout) == [], "import tito loads no framework"
    code = "import tito.verl, tito.slime, tito.areal, tito.datasets"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)

    import importlib
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        with pytest.raises(ImportError, match="pip install torch"):
            importlib.import_module("tito.torch")
    if importlib.util.find_spec("datasets") is None:
        from tito.datasets import to_hf_dataset

        with pytest.raises(ImportError, match="pip install datasets"):
            to_hf_dataset(pa.table({"a": [1]}))
    if importlib.util.find_spec("ray") is None:
        from tito.datasets import to_ray_dataset

        with pytest.raises(ImportError, match="ray"):
            to_ray_dataset(pa.table({"a": [1]}))

    # ExportDataset's iteration, on a stand-in torch (numpy arrays for tensors).
    fake = types.ModuleType("torch")
    fake.from_numpy = lambda a: a
    fake.utils = types.ModuleType("torch.utils")
    fake.utils.data = types.ModuleType("torch.utils.data")
    fake.utils.data.IterableDataset = type("IterableDataset", (), {})
    for name, mod in [("torch", fake), ("torch.utils", fake.utils),
                      ("torch.utils.data", fake.utils.data)]:
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.delitem(sys.modules, "tito.torch", raising=False)
    try:
        ExportDataset = importlib.import_module("tito.torch").ExportDataset
    finally:
        sys.modules.pop("tito.torch", None)  # bound to the stand-in

    rep = Replies(tok)
    with harness.mock_gateway(TOKENIZER, rep.text("ok")) as addr, \
            tito.Client(f"http://{addr}") as client:
        everything = roll(addr, client, 3)
        ds = ExportDataset("loader", f"http://{addr}", batch_size=2, prompt_length=P,
                           response_length=R)
        seen = []
        it = iter(ds)
        tensors, non_tensors = next(it)
        assert tensors["input_ids"].shape == (2, P + R)
        seen += list(non_tensors["trajectory_id"])
        # Not acknowledged before the step returned: a second reader gets
        # only the page not leased.
        other = [t for b in client.batches("loader", layout="verl", prompt_length=P,
                                           response_length=R) for t in b.trajectory_ids]
        assert len(other) == 1 and not set(other) & set(seen)
        seen += other
        assert list(it) == []  # acknowledges the first page
        assert sorted(seen) == sorted(everything)
        assert list(client.batches("loader", layout="verl", prompt_length=P,
                                   response_length=R)) == []
        data = client.export(layout="trajectory")
        buf = pa.BufferOutputStream()
        import pyarrow.parquet as pq

        pq.write_table(data, buf)
        assert tito.read_parquet(buf.getvalue().to_pybytes()).equals(data)


def test_pip_install_in_a_fresh_venv(tmp_path):
    """`pip install ./python` into a new venv, offline: pip, the build
    backend (flit_core, scripts/requirements-test.txt) and the dependencies
    (httpx, pyarrow, numpy) come from the test venv's site-packages, seen
    through a .pth file; then `import tito` there."""
    import importlib.util

    import importlib.metadata

    if importlib.util.find_spec("flit_core") is None:
        pytest.fail("flit_core is missing from the test venv: run scripts/setup-python.sh")
    try:
        importlib.metadata.distribution("tito-rl")
        pytest.fail("tito-rl is installed in the test venv: pip would find it satisfied")
    except importlib.metadata.PackageNotFoundError:
        pass
    src = tmp_path / "python"
    shutil.copytree(harness.ROOT / "python", src,
                    ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]
    (pathlib.Path(site) / "test-venv.pth").write_text("\n".join(ours) + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--no-index",
                    "--no-build-isolation", str(src)], check=True, cwd=tmp_path)
    code = "import tito; print(tito.__version__, tito.__file__)"
    out = subprocess.run([str(py), "-c", code],
                         capture_output=True, text=True, check=True, cwd=tmp_path,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    version, path = out.stdout.split()
    assert version == tito.__version__
    assert path.startswith(site), "imported from the fresh venv, not the source tree"
    shown = subprocess.run([str(py), "-m", "pip", "show", "tito-rl"], capture_output=True,
                           text=True, check=True).stdout
    assert "Requires: httpx, numpy, pyarrow" in shown
