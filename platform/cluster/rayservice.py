"""The Serve application for a KubeRay ``RayService`` (deploy/kubernetes/overlays/kuberay).

``loraplex serve --replicas N`` deploys the app from its own driver process (deploy.py) and stays
up to handle SIGTERM/SIGHUP. Under KubeRay the operator deploys it instead, from the RayService's
``serveConfigV2``: ``import_path: loraplex.platform.cluster.rayservice:app`` names the builder
below, which Serve calls with the config's ``args`` on the cluster. It does what the driver does
once per start — migrations, the first admin key, the usage-ledger recovery, the adapter-store
clean-up (``deploy.prepare_once``, all idempotent) — starts the control-plane actor (detached: no
driver owns it here) and returns the same two deployments, ``ingress`` and ``engine``, whose
replica counts, autoscaling and resources ``serveConfigV2``'s ``deployments`` entries override.

Settings come from the pods' environment (``LORAPLEX_*``, e.g. the database URL from a Secret) and
the optional ``args.config`` TOML file. Rolling updates are KubeRay's: a new ``serveConfigV2``
updates the app in place, a new ``rayClusterConfig`` (image) brings up a new cluster and switches
traffic once it is ready.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loraplex.platform.cluster import deploy, replica
from loraplex.platform.settings import Settings, load_settings

INGRESS = "ingress"  # deploy.deploy_app names them the same: serveConfigV2 overrides by these names
ENGINE = "engine"


def settings_from(args: dict[str, Any] | None) -> Settings:
    config = (args or {}).get("config") or None
    return load_settings(Path(config) if config else None)


def build(settings: Settings) -> Any:
    """The bound application (ingress -> engine), as deploy.deploy_app builds it; no Ray needed."""
    from ray import serve

    cl = settings.cluster
    engine = replica.deployment(settings).bind(settings)
    ingress = serve.deployment(
        name=INGRESS,
        num_replicas=cl.ingress_replicas,
        max_ongoing_requests=1000,
        ray_actor_options={"num_cpus": cl.ingress_num_cpus},
        graceful_shutdown_timeout_s=cl.drain_timeout_s,
    )(serve.ingress()(deploy.Ingress))
    return ingress.bind(settings, engine)


def app(args: dict[str, Any] | None = None) -> Any:
    """Serve's application builder (serveConfigV2 ``import_path``)."""
    settings = settings_from(args)
    if settings.db_url.startswith("sqlite"):
        raise RuntimeError("a RayService spans several pods: set LORAPLEX_DATABASE_URL to PostgreSQL")
    admin_key = deploy.prepare_once(settings)
    if admin_key:  # no LORAPLEX_ADMIN_KEY given: the generated one is in the head's Serve log, once
        deploy.log.warning("generated admin key (shown once): %s", admin_key)
    resolved = deploy.cluster_settings(settings)
    deploy.start_control(resolved, detached=True)
    return build(resolved)
