"""Everything a request or CLI command needs, built once at start and passed down."""

from __future__ import annotations

import logging
from dataclasses import InitVar, dataclass, field
from datetime import datetime

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from loraplex.platform.adapters.sources.resolver import AdapterResolver
from loraplex.platform.adapters.sources.serving import ServedReferences
from loraplex.platform.adapters.store import AdapterStore
from loraplex.platform.admin.sso.oidc import OIDCClient
from loraplex.platform.alerts.dispatcher import Dispatcher
from loraplex.platform.alerts.limits import LimitAlerts
from loraplex.platform.alerts.outbox import Outbox
from loraplex.platform.alerts.urls import Resolver, system_resolver
from loraplex.platform.auth.key_cache import KeyCache
from loraplex.platform.auth.tokens import KeyHasher
from loraplex.platform.budgets.store import BudgetStore
from loraplex.platform.budgets.wiring import build_budget_store
from loraplex.platform.db.session import make_db_engine, make_session_factory
from loraplex.platform.engine_client import EngineClient, LocalEngineClient
from loraplex.platform.inference.inflight import InflightRegistry
from loraplex.platform.observability.metrics import Metrics
from loraplex.platform.observability.requests import RequestObserver, make_tracer
from loraplex.platform.quotas.shared import LedgerAdmission
from loraplex.platform.quotas.store import InProcessQuotaStore, QuotaStore
from loraplex.platform.settings import Settings
from loraplex.platform.usage.ledger import UsageLedger

log = logging.getLogger("loraplex.platform")


@dataclass
class PlatformContext:
    settings: Settings
    db_engine: Engine
    sessions: sessionmaker[Session]
    hasher: KeyHasher
    key_cache: KeyCache
    store: AdapterStore
    engine: EngineClient = field(default_factory=LocalEngineClient.disabled)
    inflight: InflightRegistry = field(default_factory=InflightRegistry)
    # False during a degraded start (database unreachable): routes answer 503 until it is ready.
    db_ready: bool = True
    # A scale-out's ingress brings its own (the control plane's); otherwise one in this process.
    quota_store: InitVar[QuotaStore | None] = None
    # Built from the fields above in __post_init__.
    quotas: QuotaStore = field(init=False)
    ledger: UsageLedger = field(init=False)
    observer: RequestObserver = field(init=False)
    sources: ServedReferences = field(init=False)  # adapters by reference: disk cache + engine registration
    # Limit alerts (platform/alerts): the outbox the quota store writes to, and its dispatcher
    # (started with the HTTP app's lifespan). None with alerts.enabled = false.
    outbox: Outbox | None = field(init=False, default=None)
    alert_dispatcher: Dispatcher | None = field(init=False, default=None)
    # How webhook hosts are resolved (registration check and delivery, alerts/urls.py): a seam the
    # tests answer as an attacker's DNS server would (DNS rebinding).
    webhook_resolver: Resolver = field(default=system_resolver)
    budgets: BudgetStore = field(init=False)  # budgets in currency (platform/budgets)
    # The admin page's sign-in (sso.enabled): one per context, it caches the provider's discovery
    # document and keys. None when single sign-on is off.
    oidc: OIDCClient | None = field(init=False, default=None)

    def __post_init__(self, quota_store: QuotaStore | None) -> None:
        obs = self.settings.observability
        metrics = Metrics(lambda: self.engine.stats(), obs.tenant_labels, obs.max_label_values) if obs.metrics else None
        self.observer = RequestObserver(metrics, make_tracer(obs.otlp_endpoint))
        self.sources = ServedReferences(AdapterResolver.from_settings(self.settings), self.engine)
        self.ledger = UsageLedger(
            self.sessions,
            self.settings.usage_spool_dir,
            replay_interval_s=self.settings.ledger.replay_interval_s,
            lease_ttl_s=self.settings.ledger.lease_ttl_s,
        )
        if metrics is not None:
            metrics.watch_platform(self._metric_stats)
        alerts = None
        if self.settings.alerts.enabled:
            # a scale-out's ingress delivers too: its control plane writes the events to the same
            # outbox (cluster/control.py), and every ingress's dispatcher claims from it
            self.outbox = Outbox(self.sessions)
            self.alert_dispatcher = Dispatcher(
                self.sessions, self.outbox, self.settings.alerts, lambda host: self.webhook_resolver(host)
            )
            alerts = LimitAlerts(self.outbox, tuple(self.settings.alerts.thresholds))
        if quota_store is not None:
            self.quotas = quota_store
        else:
            # what other servers on this database admitted, read and added to under a per-tenant lock
            shared = LedgerAdmission(self.sessions, self.ledger, self.outbox)
            self.quotas = InProcessQuotaStore(self._tokens_since, shared=shared, alerts=alerts)
        self.budgets = build_budget_store(self)
        if self.settings.sso.enabled:
            self.oidc = OIDCClient(self.settings.sso)

    def _metric_stats(self) -> dict:
        """What /metrics reads of the platform at scrape time (observability/metrics.py)."""
        files = self.ledger.spool.pending_files()
        return {
            "engine_alive": self.engine.alive if self.engine.enabled else None,
            "usage_spool": {"files": len(files), "bytes": sum(f.stat().st_size for f in files if f.exists())},
            "adapter_sources": self.sources.resolver.counters,
        }

    def _tokens_since(self, tenant_id: str, since: datetime) -> int:
        from loraplex.platform.usage.repository import tokens_since

        self.ledger.flush()  # records still queued count against the budget too
        with self.sessions() as session:
            return tokens_since(session, tenant_id, since)

    @classmethod
    def build(
        cls,
        settings: Settings,
        engine: EngineClient | None = None,
        *,
        quotas: QuotaStore | None = None,
        inflight: InflightRegistry | None = None,
    ) -> PlatformContext:
        db_engine = make_db_engine(settings.db_url)
        return cls(
            settings=settings,
            db_engine=db_engine,
            sessions=make_session_factory(db_engine),
            hasher=KeyHasher(settings.resolved_secret()),
            key_cache=KeyCache(settings.auth.key_cache_ttl_s),
            store=AdapterStore(settings.adapter_store_dir),
            engine=engine or LocalEngineClient.disabled(),
            inflight=inflight or InflightRegistry(),
            quota_store=quotas,
        )

    def close(self) -> None:
        if self.alert_dispatcher is not None:
            self.alert_dispatcher.stop()
        self.sources.close()
        self.budgets.close()
        self.ledger.close()
        self.db_engine.dispose()
