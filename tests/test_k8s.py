"""The Kubernetes manifests of a fleet (infra/k8s/): valid against the
Kubernetes schemas, and saying what the server really accepts: its flags,
its probe routes, its port."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

import ritrag.cli
from ritrag.serving.http import ROUTES

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

K8S = Path(__file__).resolve().parent.parent / "infra" / "k8s"
KUBERNETES_VERSION = "1.30"


def documents() -> list[tuple[str, dict]]:
    found = [(path.name, doc) for path in sorted(K8S.glob("*.yaml"))
             for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]
    assert found, f"no manifests in {K8S}"
    return found


def by_kind(kind: str, name: str) -> dict:
    (found,) = [doc for _, doc in documents() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    return found


@pytest.mark.parametrize("file_name, document", documents(), ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_manifests_validate_against_the_kubernetes_schemas(file_name, document):
    kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def serve_arguments(args: list[str], monkeypatch) -> argparse.Namespace:
    """`args` (the container's command line) as `ritrag` parses them."""
    assert args[:2] == ["ritrag", "serve"]
    parsed = {}
    monkeypatch.setattr(ritrag.cli, "_serve", lambda namespace, extra: parsed.setdefault("args", namespace) and 0)
    assert ritrag.cli.main(args[1:]) == 0
    return parsed["args"]


def test_serving_replicas_probe_real_routes_on_the_port_the_server_listens_on(monkeypatch):
    deployment = by_kind("Deployment", "ritrag-serve")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = serve_arguments(container["args"], monkeypatch)
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports["http"] == args.port and args.host == "0.0.0.0"
    for probe, route in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"] == {"path": route, "port": "http"} and route in ROUTES
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    assert args.cache_dir in mounts
    assert args.index.startswith(("gs://", "s3://")) and args.watch_s > 0

    redis_service = by_kind("Service", "ritrag-redis")
    redis_port = redis_service["spec"]["ports"][0]["port"]
    assert args.budget_store == f"redis://ritrag-redis:{redis_port}/0"
    service = by_kind("Service", "ritrag-serve")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert container["resources"]["requests"]["memory"] and container["resources"]["limits"]["memory"]


def test_the_update_cronjob_runs_the_refresh_job_on_the_served_index():
    from ritrag.pipelines.refresh import RefreshOptions

    cron = by_kind("CronJob", "ritrag-refresh")
    (container,) = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python", "-m", "ritrag.pipelines.refresh"]
    options = RefreshOptions(container["args"]).get_all_options(retain_unknown_options=True)
    (serve,) = by_kind("Deployment", "ritrag-serve")["spec"]["template"]["spec"]["containers"]
    assert options["index"] == serve["args"][2] and options["crawl_dir"].startswith("/data/")
