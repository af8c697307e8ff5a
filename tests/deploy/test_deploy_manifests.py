"""The Kubernetes manifests (deploy/kubernetes/rendered/*.yaml, rendered from the kustomize overlays
by scripts/check-deploy.sh, which also validates them with kubernetes-validate and KubeRay's CRD
schema) against the code they configure: every LORAPLEX_* variable is a real setting, the config
files load, every Secret/ConfigMap/PVC a pod names exists with the keys it reads, the probes hit
the health routes, and the RayService's serveConfigV2 is a valid Serve config whose import path
builds the deployments it overrides."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RENDERED = ROOT / "deploy" / "kubernetes" / "rendered"
SECRET_KEY = "s" * 40  # production needs one >= 32 characters


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((RENDERED / name).read_text()) if d]


def one(items: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in items if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def pod_specs(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    specs = []
    for d in items:
        if d["kind"] == "Deployment":
            specs.append(d["spec"]["template"]["spec"])
        elif d["kind"] == "RayService":
            cluster = d["spec"]["rayClusterConfig"]
            specs.append(cluster["headGroupSpec"]["template"]["spec"])
            specs += [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]
    return specs


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return spec.get("initContainers", []) + spec["containers"]


def setting_exists(env_name: str) -> bool:
    """LORAPLEX_A__B -> Settings field a, then b (what pydantic-settings reads; others it ignores)."""
    from loraplex.platform.settings import Settings

    model: Any = Settings
    for part in env_name.removeprefix("LORAPLEX_").lower().split("__"):
        fields = getattr(model, "model_fields", None)
        if fields is None or part not in fields:
            return False
        model = fields[part].annotation
    return True


@pytest.mark.parametrize("render", ["one-process.yaml", "kuberay.yaml"])
def test_env_secrets_configmaps_and_volumes_resolve(render: str) -> None:
    items = docs(render)
    secrets = {
        d["metadata"]["name"]: d.get("stringData", {}) | d.get("data", {}) for d in items if d["kind"] == "Secret"
    }
    configmaps = {d["metadata"]["name"] for d in items if d["kind"] == "ConfigMap"}
    claims = {d["metadata"]["name"] for d in items if d["kind"] == "PersistentVolumeClaim"}
    specs = pod_specs(items)
    assert specs
    for spec in specs:
        volumes = {v["name"]: v for v in spec["volumes"]}
        for c in containers(spec):
            for env in c.get("env", []):
                if env["name"].startswith("LORAPLEX_"):
                    assert setting_exists(env["name"]), f"{env['name']} is no setting (platform/settings.py)"
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in secrets[ref["name"]], f"{c['name']}: secret {ref['name']} has no {ref['key']}"
            for src in c.get("envFrom", []):
                assert src["secretRef"]["name"] in secrets
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes, f"{c['name']} mounts an undefined volume {m['name']}"
        for v in volumes.values():
            if "configMap" in v:
                assert v["configMap"]["name"] in configmaps
            if "persistentVolumeClaim" in v:
                assert v["persistentVolumeClaim"]["claimName"] in claims


def test_config_files_load_as_settings(tmp_path, monkeypatch) -> None:
    """The TOML in each ConfigMap (and the image's own) loads: an unknown key or bad value fails."""
    from loraplex.platform.settings import load_settings

    monkeypatch.setenv("LORAPLEX_SECRET_KEY", SECRET_KEY)
    files = [ROOT / "deploy" / "image" / "loraplex.toml"]
    for render in ("one-process.yaml", "kuberay.yaml"):
        for d in docs(render):
            if d["kind"] == "ConfigMap":
                for key, text in d["data"].items():
                    path = tmp_path / f"{d['metadata']['name']}-{key}"
                    path.write_text(text)
                    files.append(path)
    for path in files:
        settings = load_settings(path)
        assert settings.observability.metrics


def test_one_process_probes_drain_and_pdb() -> None:
    items = docs("one-process.yaml")
    dep = one(items, "Deployment", "loraplex")
    spec = dep["spec"]["template"]["spec"]
    server = next(c for c in spec["containers"] if c["name"] == "loraplex")
    assert server["livenessProbe"]["httpGet"]["path"] == "/health"
    assert server["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert server["startupProbe"]["httpGet"]["path"] == "/health"
    assert server["args"][0] == "serve"
    assert [c["args"][:2] for c in spec["initContainers"]] == [["db", "upgrade"]]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["terminationGracePeriodSeconds"] >= 60
    pdb = one(items, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    svc = one(items, "Service")
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert dep["spec"]["replicas"] > pdb["spec"]["minAvailable"], "the PDB must leave room to drain a node"


def serve_config() -> dict[str, Any]:
    rs = one(docs("kuberay.yaml"), "RayService")
    return yaml.safe_load(rs["spec"]["serveConfigV2"])


def test_serve_config_v2_is_valid_for_ray_serve() -> None:
    pytest.importorskip("ray.serve", reason="needs loraplex[ray]")
    from ray.serve.schema import AutoscalingConfig, DeploymentSchema, ServeApplicationSchema, ServeDeploySchema

    raw = serve_config()
    cfg = ServeDeploySchema.model_validate(raw)
    assert [a.import_path for a in cfg.applications] == ["loraplex.platform.cluster.rayservice:app"]
    # Serve's schema ignores unknown keys (a misspelt option would be dropped silently): check names
    assert set(raw) <= set(ServeDeploySchema.model_fields)
    for app in raw["applications"]:
        assert set(app) <= set(ServeApplicationSchema.model_fields)
        for dep in app["deployments"]:
            assert set(dep) <= set(DeploymentSchema.model_fields), set(dep) - set(DeploymentSchema.model_fields)
            assert set(dep.get("autoscaling_config", {})) <= set(AutoscalingConfig.model_fields)


def test_serve_config_import_path_builds_the_deployments_it_overrides(tmp_path, monkeypatch) -> None:
    pytest.importorskip("ray.serve", reason="needs loraplex[ray]")
    from loraplex.platform.cluster import rayservice
    from loraplex.platform.cluster.deploy import cluster_settings
    from loraplex.platform.settings import load_settings

    app_cfg = serve_config()["applications"][0]
    module, attr = app_cfg["import_path"].split(":")
    assert getattr(importlib.import_module(module), attr) is rayservice.app
    # the cluster's own config file (the ConfigMap), with a model folder that exists here
    toml = next(d for d in docs("kuberay.yaml") if d["kind"] == "ConfigMap")["data"]["cluster.toml"]
    config = tmp_path / "cluster.toml"
    config.write_text(toml)
    monkeypatch.setenv("LORAPLEX_SECRET_KEY", SECRET_KEY)
    monkeypatch.setenv("LORAPLEX_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("LORAPLEX_ENGINE__MODEL", str(tmp_path))
    monkeypatch.setenv("LORAPLEX_ENGINE__MAX_NUM_SEQS", "8")
    monkeypatch.setenv("LORAPLEX_DATABASE_URL", "postgresql+psycopg://u:p@db:5432/loraplex")
    settings = rayservice.settings_from({"config": str(config)})
    assert settings.engine.device == "cuda" and settings.cluster.replica_num_gpus == 1
    app = rayservice.build(cluster_settings(settings))
    ingress = app._bound_deployment
    engine = next(a for a in ingress.init_args if hasattr(a, "_bound_deployment"))._bound_deployment
    built = {ingress.name, engine.name}
    assert {d["name"] for d in app_cfg["deployments"]} == built == {"ingress", "engine"}
    # a SQLite URL across pods is refused before anything starts
    monkeypatch.setenv("LORAPLEX_DATABASE_URL", "")
    with pytest.raises(RuntimeError, match="PostgreSQL"):
        rayservice.app({"config": str(config)})
    assert load_settings(config).cluster.ingress_replicas == 2
