"""docker/ without a docker engine: what can be checked here is checked.
The compose file parses and every file it references exists; the configs it
mounts pass `tito check-config`; every metric the Grafana dashboard queries
is one a running gateway's /metrics exposes after real traffic; the
Dockerfiles build with the same scripts as the README's `scripts/serve.sh`."""

import json
import pathlib
import re
import subprocess
import tempfile
import urllib.request

import pytest
import yaml
from openai import OpenAI

import harness

DOCKER = harness.ROOT / "docker"
MODEL = harness.ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_compose_parses_and_its_files_exist():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert {"postgres", "tito-1", "tito-2", "nginx", "prometheus", "grafana"} <= set(services)
    # Both replicas are one definition (a YAML anchor) and share the store.
    assert services["tito-1"] == services["tito-2"]
    build = services["tito-1"]["build"]
    context = (DOCKER / build["context"]).resolve()
    assert (context / build["dockerfile"]).is_file()
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            host = volume.split(":")[0]
            if host.startswith("."):
                assert (DOCKER / host).exists(), f"{name}: {host} is missing"
    for name, secret in compose["secrets"].items():
        # The token files are the operator's (git-ignored); their folder ships.
        assert (DOCKER / secret["file"]).parent.is_dir(), name


def test_prometheus_scrapes_and_nginx_balances_both_replicas():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    replicas = sorted(n for n in compose["services"] if n.startswith("tito-"))
    prom = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    targets = [t for job in prom["scrape_configs"] for c in job["static_configs"]
               for t in c["targets"]]
    assert targets == [f"{r}:8000" for r in replicas]
    nginx = (DOCKER / "nginx.conf").read_text()
    assert re.findall(r"server (tito-\d+):8000", nginx) == replicas
    mounted = compose["services"]["tito-1"]["volumes"][0].split(":")[0]
    store = re.search(r'^url = "(postgres://[^"]+)"', (DOCKER / mounted).read_text(), re.M)
    assert store, "the replicas' config names a postgres store"
    env = compose["services"]["postgres"]["environment"]
    assert store.group(1) == (f"postgres://{env['POSTGRES_USER']}:{env['POSTGRES_PASSWORD']}"
                              f"@postgres:5432/{env['POSTGRES_DB']}")


@pytest.mark.parametrize("config", ["config.toml", "config.cuda.toml", "config.replica.toml"])
def test_the_mounted_config_passes_check_config(config):
    if not MODEL.exists():
        pytest.fail(f"missing {MODEL}: run scripts/fetch-model.sh")
    harness.build()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="tito-docker-"))
    for role in ("trainer", "admin"):
        (tmp / f"tito_{role}_tokens").write_text(f"{role}-token-0123456789\n")
    text = (DOCKER / config).read_text()
    # The container's paths, mapped onto this checkout.
    text = text.replace("/opt/tito/", f"{harness.ROOT}/")
    text = text.replace("/run/secrets/", f"{tmp}/").replace("/var/lib/tito", str(tmp))
    (tmp / "config.toml").write_text(text)
    exe = harness.TARGET / "debug" / "tito"
    out = subprocess.run([str(exe), "check-config", "--config", str(tmp / "config.toml")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ok (listen 0.0.0.0:8000" in out.stdout


def dashboard_metrics():
    dash = json.loads((DOCKER / "grafana" / "tito.json").read_text())
    names = set()
    for panel in dash["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            for name in re.findall(r"\btito_[a-z_]+", target["expr"]):
                names.add(re.sub(r"_(bucket|sum|count)$", "", name))
    return names


def test_every_dashboard_metric_is_exposed_after_traffic():
    if not MODEL.exists():
        pytest.fail(f"missing {MODEL}: run scripts/fetch-model.sh")
    harness.build()
    proc, addr = harness.start_tito_with_default_config()
    try:
        client = OpenAI(base_url=f"http://{addr}/t/dash-1/v1", api_key="unused")
        first = [{"role": "user", "content": "Name a color."}]
        a = client.chat.completions.create(model="smollm2-135m-instruct", messages=first,
                                           max_tokens=4)
        # Turn 2 continues turn 1 (a sticky hit, cells reused); turn 3 edits
        # the answer (a drift event).
        second = first + [{"role": "assistant", "content": a.choices[0].message.content},
                          {"role": "user", "content": "Another?"}]
        client.chat.completions.create(model="smollm2-135m-instruct", messages=second,
                                       max_tokens=4)
        third = first + [{"role": "assistant", "content": "edited by the client"},
                         {"role": "user", "content": "Another?"}]
        client.chat.completions.create(model="smollm2-135m-instruct", messages=third,
                                       max_tokens=4)
        # A trainer reads a page as a consumer: the export lag is measured.
        urllib.request.urlopen(f"http://{addr}/v1/trajectories/dash-1/finish", data=b"",
                               timeout=30).read()
        urllib.request.urlopen(f"http://{addr}/v1/export?consumer=dash", timeout=30).read()
        text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=30).read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    exposed = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = re.split(r"[{ ]", line, maxsplit=1)[0]
            exposed.add(re.sub(r"_(bucket|sum|count)$", "", name))
    wanted = dashboard_metrics()
    assert len(wanted) >= 15, wanted
    assert sorted(wanted - exposed) == []


def test_dockerfiles_build_with_the_readme_scripts():
    serve = (harness.ROOT / "scripts" / "serve.sh").read_text().splitlines()
    steps = [l.strip() for l in serve if l.startswith(("scripts/", "cargo build"))]
    assert steps == ["scripts/setup-system.sh", "scripts/fetch-model.sh", "cargo build --release"]
    for dockerfile in ("Dockerfile", "Dockerfile.cuda"):
        text = (DOCKER / dockerfile).read_text()
        for step in steps:
            assert step in text, f"{dockerfile} does not run {step}"
