"""Platform settings: built-in defaults < TOML file < ``LORAPLEX_*`` environment < explicit overrides.

Read once at start (``load_settings``) and passed down; nothing else reads the environment.
Nested tables use ``__`` in environment names: ``LORAPLEX_ENGINE__MODEL=/models/llama``.
"""

from __future__ import annotations

import contextvars
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

_TOML_FILE: contextvars.ContextVar[Path | None] = contextvars.ContextVar("loraplex_toml", default=None)
MIN_SECRET_LEN = 32


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServerSettings(_Table):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    # Tests only: POST /admin/v1/debug/engine-fault (admin key) kills the engine loop as a bug would,
    # to test what supervises the process. Off: the route answers 404.
    fault_injection: bool = False
    # When the engine loop dies: seconds /ready (and /health) answer 503 before the process stops and
    # exits with status 70, so a load balancer sees it leave and a supervisor restarts it.
    engine_death_grace_s: float = Field(2.0, ge=0, le=300)


def _engine_settings_model() -> type[BaseModel]:
    """``[engine]`` is generated from ``EngineConfig`` itself: every engine field, with the engine's
    own type and default, settable from TOML / ``LORAPLEX_ENGINE__*`` / flags; an unknown key or a
    bad value is refused at load time with the field's name — never at start with a raw TypeError."""
    from loraplex.engine import EngineConfig

    hints = get_type_hints(EngineConfig)
    fields: dict[str, Any] = {
        "enabled": (bool, True),
        # Empty model = the embedded demo model (SmolLM2-135M-Instruct), converted on first start into
        # the data directory; "tiny-random" = a 3M-parameter random-weight model (tests, no package).
        "model": (str, ""),
    }
    for name, default in EngineConfig.field_defaults().items():
        fields[name] = (hints[name], default)

    def check(self: BaseModel) -> BaseModel:
        values = self.model_dump(exclude={"enabled", "model"})
        try:
            EngineConfig.check(**values)
        except (TypeError, ValueError) as exc:
            raise ValueError(str(exc)) from None
        return self

    def no_bool(value: Any) -> Any:
        # pydantic's lax mode reads a TOML `true` as 1 for an int field (`prefill_group_tokens = true`
        # started a server with groups of one token); the environment's "true" was already refused.
        if isinstance(value, bool):
            raise ValueError("Input should be a valid integer, not a boolean")
        return value

    ints = [name for name in EngineConfig.field_defaults() if hints[name] in (int, int | None)]
    validators: dict[str, Any] = {
        "check_with_engine_config": model_validator(mode="after")(check),
        "no_bool_for_int": field_validator(*ints, mode="before")(no_bool),
    }
    return create_model("EngineSettings", __base__=_Table, __validators__=validators, **fields)


if TYPE_CHECKING:

    class EngineSettings(_Table):  # what type checkers see; the real class is generated below
        enabled: bool = True
        model: str = ""

        def __getattr__(self, name: str) -> Any: ...
else:
    EngineSettings = _engine_settings_model()


def engine_config_kwargs(engine: BaseModel) -> dict[str, Any]:
    """The ``EngineConfig`` keyword arguments of validated ``[engine]`` settings (all but model)."""
    return engine.model_dump(exclude={"enabled", "model"})


class UploadSettings(_Table):
    max_upload_bytes: int = Field(64 * 1024 * 1024, ge=1)
    max_members: int = Field(16, ge=1)
    max_unpacked_bytes: int = Field(256 * 1024 * 1024, ge=1)
    # The whole multipart upload must arrive within this long (and, like every body, with no pause
    # over limits.body_idle_timeout_s): a stalled upload gets 408 and its staged file is removed.
    upload_timeout_s: float = Field(600.0, gt=0)
    # Leftover staging / unreferenced store folders older than this are swept this often (and at start).
    sweep_interval_s: float = Field(3600.0, gt=0)


class AdapterSourceSettings(_Table):
    """Adapters registered by reference (s3://, file://, hf://): where fetched copies are cached
    and how the stores are reached. S3 credentials come from the standard AWS variables
    (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_DEFAULT_REGION) unless set here."""

    cache_dir: str = ""  # empty = <data_dir>/adapter-cache
    cache_max_bytes: int = Field(10 * 1024**3, ge=1)  # LRU beyond this
    # A request for an uncached adapter waits at most this long for its download (then 503).
    fetch_timeout_s: float = Field(20.0, gt=0)
    # Store I/O bounds (docs/adapters.md#a-slow-or-dead-store): one fetch (listing and every file)
    # ends at this deadline whatever the store does (a trickle too); 0 = 6 x fetch_timeout_s.
    fetch_deadline_s: float = Field(0.0, ge=0)
    fetches_per_store: int = Field(2, ge=1)  # running fetches per store (S3 endpoint or bucket, file, hub)
    fetch_queue_per_store: int = Field(8, ge=0)  # waiting fetches per store; beyond: 503 source_busy at once
    fetch_threads: int = Field(16, ge=1)  # fetch threads of all stores together
    s3_endpoint_url: str = ""  # empty = AWS_ENDPOINT_URL, or AWS itself
    s3_region: str = ""  # empty = AWS_DEFAULT_REGION
    s3_max_attempts: int = Field(2, ge=1)
    connect_timeout_s: float = Field(3.0, gt=0)
    read_timeout_s: float = Field(10.0, gt=0)
    # file:// sources must lie under one of these folders (no link anywhere below it); empty = only
    # <data_dir>/adapter-files. ["/"] allows any folder (links are still refused).
    file_roots: list[str] = Field(default_factory=list)
    hf_cache_dir: str = ""  # empty = huggingface_hub's default (HF_HOME)
    hf_offline: bool = False  # only what the hub cache holds (HF_HUB_OFFLINE=1 does the same)


class AuthSettings(_Table):
    # Tenant key lookups are cached this long; revocation evicts the entry at once.
    key_cache_ttl_s: float = Field(10.0, ge=0)


class SSOSettings(_Table):
    """OpenID Connect sign-in for the admin page (docs/sso.md). Off unless ``enabled``; the admin
    key keeps working either way (automation)."""

    enabled: bool = False
    issuer: str = (
        ""  # e.g. https://keycloak.example.com/realms/ops; discovery reads <issuer>/.well-known/openid-configuration
    )
    client_id: str = ""
    client_secret: str = ""  # set it through LORAPLEX_SSO__CLIENT_SECRET, never in a file
    # The admin page's public origin, e.g. https://llm.example.com: the redirect URI is
    # <base_url>/admin/sso/callback, and a cookie-authenticated write must come from this origin.
    base_url: str = ""
    scopes: str = "openid email profile"
    role_claim: str = "groups"  # an ID-token claim (a string or a list of strings), e.g. groups, roles, email
    # claim value -> roles: "admin", "viewer" or "tenant_admin:<tenant id>"; no match = no sign-in
    role_map: dict[str, list[str]] = Field(default_factory=dict)
    session_lifetime_s: int = Field(8 * 3600, ge=60)
    login_timeout_s: int = Field(600, ge=30)  # how long a started sign-in may take at the provider
    http_timeout_s: float = Field(10.0, gt=0)  # discovery, keys and the token exchange

    @model_validator(mode="after")
    def _check(self) -> SSOSettings:
        if self.enabled:
            missing = [n for n in ("issuer", "client_id", "base_url") if not getattr(self, n)]
            if missing:
                raise ValueError(f"sso.enabled needs {', '.join('sso.' + n for n in missing)}")
            if not self.role_map:
                raise ValueError("sso.enabled needs sso.role_map (claim value -> roles); nobody could sign in")
        for value, roles in self.role_map.items():
            for role in roles:
                if role not in ("admin", "viewer") and not (role.startswith("tenant_admin:") and len(role) > 13):
                    raise ValueError(
                        f"sso.role_map[{value!r}]: unknown role {role!r} (admin, viewer, tenant_admin:<id>)"
                    )
        return self


class ObservabilitySettings(_Table):
    metrics: bool = True  # serve /metrics (Prometheus text format)
    tenant_labels: bool = False  # label request metrics by tenant and adapter (bounded, see below)
    max_label_values: int = Field(100, ge=1)  # distinct tenants / adapters per label; the rest are "other"
    json_logs: bool = False  # one JSON object per log line (request id, tenant, adapter, timings)
    otlp_endpoint: str = ""  # e.g. http://collector:4318/v1/traces: one span per request when set


class LimitsSettings(_Table):
    # Tenant API request bodies larger than this are refused with 413 before they are read.
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    # A request generating longer than this is ended (finish_reason "length", usage status
    # "timeout"); a tenant's quota may set its own (max_generation_s).
    generation_timeout_s: float = Field(600.0, gt=0)
    # Admin API JSON bodies (tenants, keys, quotas...; not the adapter upload, see [uploads]).
    max_admin_body_bytes: int = Field(1024 * 1024, ge=1024)
    # A request body must arrive whole within this long (a slow writer gets 408 and is dropped).
    body_timeout_s: float = Field(30.0, gt=0)
    # No request body (uploads included) may pause longer than this between two chunks (408).
    body_idle_timeout_s: float = Field(15.0, gt=0)
    # An idle keep-alive connection is closed after this long (uvicorn's timeout_keep_alive).
    idle_timeout_s: float = Field(15.0, gt=0)
    # A request line and headers must arrive whole within this long (checked every this long, so
    # a silent or stalled connection is closed after one to two of it; platform/http/head_deadline.py).
    header_timeout_s: float = Field(20.0, gt=0)
    # The request line and headers together: a longer head gets 431 and the connection is closed.
    max_header_bytes: int = Field(64 * 1024, ge=4096)


class OpenAISettings(_Table):
    # A Jinja chat template (a file path, or the template text) used instead of the tokenizer's
    # (vLLM's --chat-template); empty = the tokenizer's own.
    chat_template: str = ""
    # How calls are read back from the model's text with tool_choice "auto" (vLLM's
    # --tool-call-parser): hermes, llama3_json, mistral or pythonic. It must match the template.
    tool_call_parser: Literal["hermes", "llama3_json", "mistral", "pythonic"] = "hermes"
    # Per-request chat_template runs tenant-supplied Jinja (sandboxed, but it can burn CPU): off
    # unless the operator trusts its tenants (vLLM's --trust-request-chat-template).
    trust_request_chat_template: bool = False


class ResponsesSettings(_Table):
    """Stored responses (``store: true`` on /v1/responses; docs/openai-api.md)."""

    # Kept this long (OpenAI: 30 days), then answered 404 and deleted by a periodic sweep.
    retention_days: float = Field(30.0, gt=0)
    # Per tenant, over the responses not yet expired: a request that would store past either cap
    # is refused (400 naming ``store``) before it generates; send ``store: false`` or delete some.
    max_stored_per_tenant: int = Field(10_000, ge=1)
    max_stored_bytes_per_tenant: int = Field(100 * 1024 * 1024, ge=1)
    sweep_interval_s: float = Field(600.0, gt=0)


class LedgerSettings(_Table):
    # A long stream writes its token count this often, so a crash bills it up to here.
    checkpoint_interval_s: float = Field(2.0, gt=0)
    # How often a local spool (kept while the database is unreachable) is retried.
    replay_interval_s: float = Field(1.0, gt=0)
    # Wait for the admission and final records to be durable before answering. Off = the old
    # fire-and-forget writer (a crash loses recent records); only for measuring what it costs.
    durable: bool = True
    # Each server holds a lease (a heartbeat row in server_instances); start-up recovery closes the
    # running records only of servers whose lease is this old, never those of a live neighbour.
    lease_ttl_s: float = Field(30.0, gt=0)


class AlertSettings(_Table):
    """Alerts from quota windows to webhooks (docs/alerts.md)."""

    # Off: no events are recorded and no dispatcher runs.
    enabled: bool = True
    # Percentages of a windowed limit (the token budget's day or month) that each fire one
    # ``limit.threshold`` event per window.
    thresholds: list[int] = Field(default_factory=lambda: [50, 80, 100])
    # Seconds between two dispatcher passes (fan-out, claim, deliver).
    dispatch_interval_s: float = Field(1.0, gt=0, le=3600)
    # A delivery is retried this many times in all, then marked dead.
    max_attempts: int = Field(8, ge=1, le=100)
    # Backoff after the n-th failed attempt: base * 2**(n-1), capped, with jitter (half fixed, half random).
    backoff_base_s: float = Field(2.0, gt=0)
    backoff_max_s: float = Field(600.0, gt=0)
    delivery_timeout_s: float = Field(10.0, gt=0, le=120)
    # A claimed delivery belongs to its server this long; a server killed mid-delivery loses it then.
    lease_s: float = Field(60.0, gt=0)
    batch_size: int = Field(50, ge=1, le=1000)
    # Caps (422 beyond them, docs/limits.md): webhooks scoped to one tenant, webhooks for every
    # tenant (tenant_id null), and the webhooks one event goes to (the operator's + its tenant's).
    max_webhooks_per_tenant: int = Field(10, ge=0, le=10_000)
    max_operator_webhooks: int = Field(20, ge=0, le=10_000)
    max_fanout_per_event: int = Field(25, ge=1, le=10_000)
    # Retention: delivered and dead deliveries, and events with none left whose window has
    # closed, are deleted once older than this (0 keeps them forever); swept this often.
    retention_days: float = Field(30.0, ge=0, le=36_500)
    sweep_interval_s: float = Field(3600.0, gt=0)
    # SSRF: webhook URLs whose host resolves to a private, loopback or link-local address are
    # refused unless the host is listed here (or allow_private_hosts is set).
    allowed_hosts: list[str] = Field(default_factory=list)
    allow_private_hosts: bool = False

    @model_validator(mode="after")
    def _check(self) -> AlertSettings:
        if any(not 0 < t <= 1000 for t in self.thresholds):
            raise ValueError("alerts.thresholds are percentages in (0, 1000]")
        if self.lease_s <= self.delivery_timeout_s:
            raise ValueError("alerts.lease_s must exceed alerts.delivery_timeout_s (a lease outlives a delivery)")
        return self


class ClusterSettings(_Table):
    """Scale-out on Ray Serve (docs/scale-out.md). ``replicas = 1`` is the plain process, no Ray."""

    replicas: int = Field(1, ge=1)
    # Empty = start a local Ray instance; "auto" or "ray://host:10001" / "host:6379" joins a cluster.
    ray_address: str = ""
    # Ingress (HTTP app) replicas; more than one turns the tenant key cache off (see the docs).
    ingress_replicas: int = Field(1, ge=1)
    # Autoscaling of the engine deployment: off while max_replicas <= replicas.
    min_replicas: int = Field(1, ge=1)
    max_replicas: int = Field(0, ge=0)
    target_ongoing_requests: float = Field(16.0, gt=0)
    # How long the load must stay above / below target before Serve adds / removes a replica.
    upscale_delay_s: float = Field(30.0, ge=0)
    downscale_delay_s: float = Field(600.0, ge=0)
    # Resources of one engine replica: a GPU each on GPU machines, a CPU share on CPU boxes.
    replica_num_cpus: float = Field(1.0, ge=0)
    replica_num_gpus: float = Field(0.0, ge=0)
    ingress_num_cpus: float = Field(0.5, ge=0)
    # "affinity": the adapter is Serve's multiplexed model id (requests go where it is resident);
    # "prefix": scored by cached prompt prefix, adapter residency and load (cluster/routing.py);
    # "load": no affinity, every request to the least loaded replica (a baseline to measure against).
    routing: Literal["affinity", "prefix", "load"] = "affinity"
    # Adapters a replica reports as resident to Serve's multiplexed router (LRU beyond this).
    max_adapters_per_replica: int = Field(0, ge=0)  # 0 = engine.max_loras (the device slots)
    # The ingress never waits longer than this for a replica's next chunk (a dead or stuck replica).
    chunk_timeout_s: float = Field(60.0, gt=0)
    # Scaling down and a rolling restart let a replica finish its requests for up to this long
    # before it stops.
    drain_timeout_s: float = Field(120.0, gt=0)
    # Extra engine replicas a rolling restart (SIGHUP) starts before it stops old ones: the old
    # keep serving until their successors are up. 0 where the nodes have no room for one more (one
    # replica per GPU, all in use): an old replica then drains and stops before its successor starts.
    rollout_surge: int = Field(1, ge=0)
    # How often a replica pulls the control plane's tenant/adapter state and reports its stats.
    sync_interval_s: float = Field(0.5, gt=0)
    # Fair-share (VTC) counters shared by the replicas through the control plane (docs/scale-out.md).
    global_fairness: bool = True
    # Node-local scratch of an engine replica: each keeps its own cache of adapters registered by
    # reference in <replica_data_dir>/adapter-cache/replicas/<replica>/ (nothing shared with the
    # ingress or another replica). Empty: <adapter cache>/replicas/ (data_dir's, or adapters.cache_dir).
    replica_data_dir: str = ""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="LORAPLEX_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    environment: Literal["demo", "development", "production"] = "demo"
    data_dir: Path = Path("data")
    # Empty = SQLite file inside data_dir.
    database_url: str = ""
    # HMAC secret for API key hashes. Required outside demo mode; demo mode keeps a random one in
    # data_dir so keys survive restarts.
    secret_key: str = ""
    # Optional fixed admin key; without it, a key is generated on first start and printed once.
    admin_key: str = ""
    server: ServerSettings = Field(default_factory=ServerSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    uploads: UploadSettings = Field(default_factory=UploadSettings)
    adapters: AdapterSourceSettings = Field(default_factory=AdapterSourceSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    sso: SSOSettings = Field(default_factory=SSOSettings)
    observability: ObservabilitySettings = Field(default_factory=ObservabilitySettings)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    ledger: LedgerSettings = Field(default_factory=LedgerSettings)
    responses: ResponsesSettings = Field(default_factory=ResponsesSettings)
    openai: OpenAISettings = Field(default_factory=OpenAISettings)
    cluster: ClusterSettings = Field(default_factory=ClusterSettings)
    alerts: AlertSettings = Field(default_factory=AlertSettings)

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.environment != "demo" and len(self.secret_key) < MIN_SECRET_LEN:
            raise ValueError(
                f"secret_key must be set to at least {MIN_SECRET_LEN} characters "
                f"(LORAPLEX_SECRET_KEY) when environment is {self.environment!r}; "
                "only the demo environment may run without one"
            )
        if self.admin_key and len(self.admin_key) < 16:
            raise ValueError("admin_key (LORAPLEX_ADMIN_KEY) must be at least 16 characters")
        return self

    @property
    def db_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'loraplex.db').resolve()}"

    @property
    def usage_spool_dir(self) -> Path:
        return self.data_dir / "usage-spool"

    @property
    def adapter_store_dir(self) -> Path:
        return self.data_dir / "adapters"

    def resolved_secret(self) -> str:
        """The HMAC secret; in demo mode without one, a random secret persisted in data_dir."""
        if self.secret_key:
            return self.secret_key
        path = self.data_dir / "secret_key"
        if path.exists():
            return path.read_text().strip()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        value = secrets.token_urlsafe(48)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(value)
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        toml_file = _TOML_FILE.get()
        if toml_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_file))
        return tuple(sources)


class ConfigError(Exception):
    """Settings could not be loaded; the message says which field and why."""


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Build the settings once. ``overrides`` (CLI flags) win over the environment and the file."""
    from pydantic import ValidationError

    if config_file is not None:
        config_file = Path(config_file)
        if not config_file.is_file():
            raise ConfigError(f"config file not found: {config_file}")
    token = _TOML_FILE.set(config_file)
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "settings"
            lines.append(f"  {where}: {err['msg']}")
        source = f" (from {config_file})" if config_file else ""
        raise ConfigError("invalid configuration" + source + ":\n" + "\n".join(lines)) from None
    finally:
        _TOML_FILE.reset(token)
