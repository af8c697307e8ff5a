"""Platform settings: built-in defaults < TOML file < ``LORAPLEX_*`` environment < explicit overrides.

Read once at start (``load_settings``) and passed down; nothing else reads the environment.
Nested tables use ``__`` in environment names: ``LORAPLEX_ENGINE__MODEL=/models/llama``.
"""
from __future__ import annotations

import contextvars
import os
import secrets
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
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


class EngineSettings(_Table):
    enabled: bool = True
    # Empty model = the embedded demo model (SmolLM2-135M-Instruct), converted on first start into
    # the data directory; "tiny-random" = a 3M-parameter random-weight model (tests, no package).
    model: str = ""
    dtype: str = "auto"  # auto: checkpoint dtype on CUDA, bf16 on a CPU with native bf16, else fp32
    device: str = "auto"  # auto: CUDA when present
    max_num_seqs: int | None = Field(None, ge=1)  # None: sized from the device's free memory
    max_loras: int = Field(4, ge=1)
    max_lora_rank: int = Field(16, ge=1)
    kernel_backend: str = "auto"
    # Passed verbatim to EngineConfig (scheduler policy, KV blocks, ...).
    extra: dict[str, Any] = Field(default_factory=dict)


class UploadSettings(_Table):
    max_upload_bytes: int = Field(64 * 1024 * 1024, ge=1)
    max_members: int = Field(16, ge=1)
    max_unpacked_bytes: int = Field(256 * 1024 * 1024, ge=1)


class AuthSettings(_Table):
    # Tenant key lookups are cached this long; revocation evicts the entry at once.
    key_cache_ttl_s: float = Field(10.0, ge=0)


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
    auth: AuthSettings = Field(default_factory=AuthSettings)

    @model_validator(mode="after")
    def _check(self) -> "Settings":
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
