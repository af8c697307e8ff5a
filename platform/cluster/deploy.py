"""``loraplex serve --replicas N``: Ray, the control-plane actor and the two Serve deployments.

The driver (this process) does what must happen once per start: migrate the database, create the
first admin key, recover the usage ledger of a previous run and clean the adapter store. Then the
ingress replicas (the same FastAPI app as the single process) and the engine replicas start, and
the driver waits for a signal.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
from pathlib import Path
from typing import Any

from loraplex.platform.cluster.control import ACTOR_NAME, NAMESPACE, ControlConfig, ControlPlane
from loraplex.platform.cluster.drain import drain
from loraplex.platform.settings import Settings

log = logging.getLogger("loraplex.platform.cluster")
APP_NAME = "loraplex"
# Ray names every Serve replica's actor "SERVE_REPLICA::<app>#<deployment>#<id>" (Ray 2.60's
# ReplicaID.to_full_id_str); the ingress deployment is named "ingress" below.
INGRESS_ACTOR_PREFIX = f"SERVE_REPLICA::{APP_NAME}#ingress#"


class Ingress:
    """The HTTP app as Serve's ingress: routes, auth, admission and billing run here; generation
    goes to the engine deployment through its handle."""

    def __init__(self, settings: Settings, engine_handle: Any) -> None:
        self.settings = settings  # cluster_settings(): as the driver resolved them
        self.engine_handle = engine_handle

    def __serve_build_asgi_app__(self) -> Any:
        import ray

        from loraplex.platform.app import create_app
        from loraplex.platform.cluster.quota_store import ActorQuotaStore
        from loraplex.platform.cluster.remote_client import AbortBroadcast, RemoteEngineClient
        from loraplex.platform.context import PlatformContext
        from loraplex.platform.db.session import unit_of_work
        from loraplex.platform.engine_client import resolve_model_dir
        from loraplex.platform.engine_sync import sync_all
        from loraplex.platform.inference.inflight import InflightRegistry

        settings = self.settings
        control = ray.get_actor(ACTOR_NAME, namespace=NAMESPACE)
        # named by its Ray actor, which the control plane lists (liveness.py): a silent ingress
        # keeps its holds while Ray holds its actor, and a restarted instance waits for the live
        # ingresses that held reservations, by name, before it admits new limited holds
        name = ray.get_runtime_context().get_actor_name() or f"ingress-{os.getpid()}"
        quotas = ActorQuotaStore(control, owner=name)  # its holds live on this ingress's lease
        inflight = InflightRegistry(peers=AbortBroadcast(control))  # an admin abort reaches every ingress
        client = RemoteEngineClient(
            settings,
            self.engine_handle,
            control,
            resolve_model_dir(settings),
            name=name,
            quotas=quotas,
            inflight=inflight,
        )
        ctx = PlatformContext.build(settings, client, quotas=quotas, inflight=inflight)
        client.start()
        ctx.ledger.start()  # recovery of a previous run's records is the driver's, done once
        ctx.budgets.start()  # budget settles; a dead ingress's holds are settled by a live one
        with unit_of_work(ctx.sessions) as session:
            sync_all(session, client, ctx.store.root)  # idempotent: the same state from every ingress
        return create_app(ctx, owns_engine=False)


def ray_serve_installed() -> bool:
    """Whether the ``ray`` extra is installed (``--replicas 1`` never imports it)."""
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError:
        return False
    return True


def cluster_settings(settings: Settings) -> Settings:
    """The settings every replica and ingress is started with (Ray pickles them): absolute paths
    (Ray workers run in another directory), the database URL resolved, the key cache off when
    several ingress replicas could each hold a revoked key."""
    from loraplex.platform.engine_client import resolve_model_dir

    model = str(resolve_model_dir(settings))  # the demo model is built once, here
    auth = settings.auth
    if settings.cluster.ingress_replicas > 1:
        auth = auth.model_copy(update={"key_cache_ttl_s": 0.0})
    return settings.model_copy(
        update={
            "data_dir": Path(settings.data_dir).resolve(),
            "database_url": settings.db_url,
            "engine": settings.engine.model_copy(update={"model": model}),
            "auth": auth,
        }
    )


# Serve's own checks of its HTTP proxy assume a quiet machine (ready within 5 s, healthy within
# 10 s, three misses and it is killed): on a loaded 2-core box the proxy was killed and restarted
# in a loop and the app never came up. The same for the router's probe of a replica's queue length
# (0.1 s, doubled per retry up to 1 s): a probe unanswered in time counts as "replica full", and for
# a multiplexed request (an adapter) the very next try already goes to the replica with the fewest
# adapters, so on a busy box adapter affinity fell to ~0.5 (the probe-timeout warnings are in the
# ingress logs). A slow answer is still an answer; a dead replica fails its probe at once. And the
# router's cached queue lengths (corrected by every response) expire after 10 s: a replica unused
# that long had no entry, and a burst admitted at once (reserves are batched) all went to the
# replica that had one while the other's probe was still out. Processes of a local Ray inherit the
# driver's environment; an operator's own values win.
SERVE_PATIENCE = {
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60",
    "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "60",
    "RAY_SERVE_PROXY_HEALTH_CHECK_PERIOD_S": "10",
    "RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S": "2",
    "RAY_SERVE_MAX_QUEUE_LENGTH_RESPONSE_DEADLINE_S": "5",
    "RAY_SERVE_QUEUE_LENGTH_CACHE_TIMEOUT_S": "120",
}


def ingress_lease_s(sync_interval_s: float) -> float:
    """How long an ingress may stay silent before the control plane releases its reservations:
    many of its snapshot ticks, so a stall on a loaded machine is not taken for a death (a live
    ingress whose lease lapsed anyway hands its holds back at its next tick)."""
    return max(20.0, 40 * sync_interval_s)


def start(settings: Settings) -> Any:
    """Start (or join) Ray and deploy. Returns the control actor's handle."""
    import ray
    from ray import serve

    cl = settings.cluster
    init: dict[str, Any] = {"namespace": NAMESPACE, "include_dashboard": False, "log_to_driver": True}
    if cl.ray_address:
        init["address"] = cl.ray_address
    else:  # a local instance: enough logical CPUs for the replicas' shares (they are scheduling units)
        for name, value in SERVE_PATIENCE.items():
            os.environ.setdefault(name, value)
        engines = max(cl.replicas, cl.max_replicas) + cl.rollout_surge  # a rolling restart's successors too
        need = engines * cl.replica_num_cpus + cl.ingress_replicas * cl.ingress_num_cpus
        init["num_cpus"] = max(os.cpu_count() or 1, math.ceil(need + 1))
        if cl.replica_num_gpus:
            init["num_gpus"] = None  # let Ray detect them
        # Ray starts its workers at nice 15 by default (meant for batch jobs sharing a node). Here the
        # workers ARE the server: the engine replicas and the ingress. At nice 15 anything else on the
        # machine (a neighbour's process, a test's CPU burner) takes ~97% of a contended core from
        # them. The raylet reads this from its environment when ray.init starts it.
        os.environ.setdefault("RAY_worker_niceness", "0")
    _init_ray(init)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) > 1 and settings.db_url.startswith("sqlite"):
        ray.shutdown()
        raise RuntimeError(
            f"this Ray cluster has {len(nodes)} nodes: replicas on other nodes cannot share a "
            "SQLite file; set database_url to PostgreSQL (docs/scale-out.md)"
        )
    resolved = cluster_settings(settings)
    control = start_control(resolved)
    serve.start(http_options={"host": settings.server.host, "port": settings.server.port})
    deploy_app(resolved, generation=0)
    log.info(
        "loraplex is serving on http://%s:%d with %d engine replica(s)",
        settings.server.host,
        settings.server.port,
        cl.replicas,
    )
    return control


def control_config(settings: Settings) -> ControlConfig:
    """From ``cluster_settings()``: absolute paths, the database URL resolved."""
    cl = settings.cluster
    return ControlConfig(
        db_url=settings.db_url,
        store_root=str(settings.adapter_store_dir),
        replica_ttl_s=max(5.0, 6 * cl.sync_interval_s),
        ingress_lease_s=ingress_lease_s(cl.sync_interval_s),
        # a restarted instance admits new limited holds once this many ingresses handed theirs back
        expected_ingresses=cl.ingress_replicas,
        ingress_prefix=INGRESS_ACTOR_PREFIX,
        alert_thresholds=tuple(settings.alerts.thresholds) if settings.alerts.enabled else None,
    )


def start_control(settings: Settings, *, detached: bool = False) -> Any:
    """The control-plane actor (an existing one is reused: a redeploy). Restarted by Ray when it
    dies (state rebuilt from the database, the replicas and the ingresses); calls in flight at the
    death are retried on the new instance. ``detached``: it outlives the process that made it
    (KubeRay's application builder, ``rayservice.py``)."""
    import ray

    options: dict[str, Any] = {
        "name": ACTOR_NAME,
        "namespace": NAMESPACE,
        "get_if_exists": True,
        "max_concurrency": 1,  # one call at a time: "check every limit, then hold" is atomic
    }
    if detached:
        options["lifetime"] = "detached"
    actor = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(ControlPlane)
    return actor.options(**options).remote(control_config(settings))


def _init_ray(init: dict[str, Any], attempts: int = 5) -> None:
    """``ray.init``, made again when a local start timed out: Ray waits a fixed 30 s for its raylet
    to register with the GCS, which a loaded 2-core box can exceed. The processes the failed
    attempt started are killed before the next one (they are this process's children)."""
    import ray

    for attempt in range(1, attempts + 1):
        before = _children()
        try:
            ray.init(**init)
            return
        except Exception as exc:
            if "address" in init or "timed out during startup" not in str(exc) or attempt == attempts:
                raise
            log.warning("ray.init attempt %d: %s; starting Ray again", attempt, exc)
            try:
                ray.shutdown()
            except Exception:  # noqa: BLE001 - nothing was up to shut down
                pass
            _kill_new_children(before)


def _children() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def _kill_new_children(before: set[int]) -> None:
    import psutil

    for proc in psutil.Process().children(recursive=True):
        if proc.pid not in before:
            try:
                proc.kill()
            except psutil.Error:
                pass


def deploy_app(settings: Settings, generation: int, wait: bool = True) -> None:
    """(Re)deploy the app. Both deployments carry explicit versions, so deploying again with the
    next ``generation`` replaces the engine replicas only, as a rolling update: Serve starts
    ``rollout_surge`` successors, and once one is up it stops an old replica, which takes no new
    request and finishes its streams (for up to ``drain_timeout_s``) before it exits; the other
    replicas serve meanwhile, and the ingresses, and the streams through them, stay. ``wait``:
    return once the app is running (the first deploy); a rollout is followed by ``rollout_done``."""
    from ray import serve

    from loraplex.platform.cluster import replica

    cl = settings.cluster
    engine = _versioned(replica.deployment(settings), f"engine-{generation}").bind(settings)
    ingress = serve.deployment(
        name="ingress",
        num_replicas=cl.ingress_replicas,
        max_ongoing_requests=1000,
        ray_actor_options={"num_cpus": cl.ingress_num_cpus},
        # a rolling restart without fixed versions would restart the ingresses too: their
        # streams get as long as the engine replicas' to finish
        graceful_shutdown_timeout_s=cl.drain_timeout_s,
    )(serve.ingress()(Ingress))
    app = _versioned(ingress, "ingress-0").bind(settings, engine)
    # serve._run is serve.run with the wait for RUNNING optional: a rollout takes as long as the
    # old replicas' drain, and the driver must stay responsive to SIGTERM meanwhile
    serve._run(app, name=APP_NAME, route_prefix="/", _blocking=wait)


def rollout_state() -> tuple[str, int]:
    """The engine deployment's Serve status (HEALTHY once a rollout has replaced every replica
    and they all run) and how many of its replicas are running."""
    from ray import serve

    engine = serve.status().applications[APP_NAME].deployments["engine"]
    states = {getattr(k, "value", k): n for k, n in engine.replica_states.items()}
    return str(getattr(engine.status, "value", engine.status)), int(states.get("RUNNING", 0))


def _versioned(deployment: Any, version: str) -> Any:
    """Serve removed the public ``version`` option: it gives every deployment a new random version
    at each ``serve.run``, so a redeploy would restart every replica, the ingresses too. With a
    fixed version per deployment a redeploy replaces only the one whose version changed;
    ``_internal`` is how Serve's own config path still sets it (without it: the random default)."""
    try:
        return deployment.options(version=version, _internal=True)
    except (TypeError, ValueError):
        return deployment


def prepare_once(settings: Settings) -> str | None:
    """What one start does once, before any replica: migrate, first admin key, recover the usage
    ledger of a previous run (records left running become interrupted), clean the adapter store."""
    from loraplex.platform.adapters.housekeeping import cleanup_store
    from loraplex.platform.auth.admin import ensure_admin_key
    from loraplex.platform.context import PlatformContext
    from loraplex.platform.db import migrate
    from loraplex.platform.db.session import unit_of_work

    migrate.upgrade(settings.db_url)
    ctx = PlatformContext.build(settings)
    try:
        with unit_of_work(ctx.sessions) as session:
            admin_key = ensure_admin_key(session, ctx.hasher, settings.admin_key)
        ctx.ledger.recover()
        with unit_of_work(ctx.sessions) as session:
            cleanup_store(session, ctx.store)
    finally:
        ctx.close()
    return admin_key


def run(settings: Settings) -> None:
    """Deploy and block until SIGINT/SIGTERM, then drain and take the deployments down."""
    import ray
    from ray import serve

    stop, wake = threading.Event(), threading.Event()
    rollouts = [0]  # SIGHUPs received

    def on_stop(*_: object) -> None:
        stop.set()
        wake.set()

    def on_hup(*_: object) -> None:
        rollouts[0] += 1
        wake.set()

    # SIGHUP: a rolling restart of the engine replicas (new code or weights on disk, a leaking
    # replica), cutting nothing. Installed before the start (the default action would end the
    # driver); one received meanwhile rolls the replicas once they are up.
    signal.signal(signal.SIGHUP, on_hup)
    control = start(settings)  # this reference keeps the control-plane actor alive
    # After ray.init, which installs its own SIGTERM handler in the driver (it would exit at once,
    # cutting every stream): a signal here starts the drain instead.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_stop)
    print(
        f"loraplex serving on http://{settings.server.host}:{settings.server.port} "
        f"({settings.cluster.replicas} engine replicas on Ray Serve)",
        flush=True,
    )
    generation = 0
    rollout: list[str] | None = None  # the statuses seen since a rollout began, until it is complete
    resolved = cluster_settings(settings)
    while not stop.is_set():
        wake.wait(timeout=2.0 if rollout is not None else None)
        wake.clear()
        if rollouts[0] > generation and not stop.is_set():
            generation = rollouts[0]
            print(f"loraplex: rolling restart {generation} of the engine replicas started", flush=True)
            deploy_app(resolved, generation, wait=False)
            rollout = []
        elif rollout is not None and _rollout_done(generation, rollout):
            rollout = None
    try:
        drain(control, settings.cluster.drain_timeout_s, settings.cluster.sync_interval_s)
        try:
            serve.delete(APP_NAME)  # replicas first, the control plane they talk to last
        except TimeoutError as exc:  # Serve's own 60 s bound: a replica slow to go; Ray's shutdown takes it
            log.warning("taking the app down: %s", exc)
        serve.shutdown()
    finally:
        del control
        ray.shutdown()


def _rollout_done(generation: int, seen: list[str]) -> bool:
    """Say (once) that the rollout finished: Serve reported the engine deployment updating and
    now healthy again (it stays UPDATING until no replica of the old version is left)."""
    try:
        status, running = rollout_state()
    except Exception as exc:  # noqa: BLE001 - the controller busy: ask again at the next tick
        log.warning("rolling restart: no status: %s", exc)
        return False
    seen.append(status)
    if status != "HEALTHY" or all(s == "HEALTHY" for s in seen):
        return False
    print(f"loraplex: rolling restart {generation} complete ({running} engine replicas running)", flush=True)
    return True
