"""Settings: defaults = configs/default.toml; TOML < environment < explicit overrides; clear errors."""
from __future__ import annotations

from pathlib import Path

import pytest

from loraplex.platform.settings import ConfigError, load_settings

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    import os

    for name in [n for n in os.environ if n.startswith("LORAPLEX_") and not n.startswith("LORAPLEX_TEST")
                 and n != "LORAPLEX_REQUIRE_POSTGRES"]:
        monkeypatch.delenv(name)


def test_builtin_defaults_are_the_default_toml():
    assert load_settings(CONFIGS / "default.toml") == load_settings()
    s = load_settings()
    assert s.environment == "demo" and s.engine.device == "auto" and s.db_url.startswith("sqlite:///")


def test_example_configs_load(monkeypatch):
    monkeypatch.setenv("LORAPLEX_SECRET_KEY", "s" * 40)
    gpu = load_settings(CONFIGS / "gpu.example.toml")
    assert gpu.engine.device == "cuda" and gpu.engine.kernel_backend == "triton"
    pg = load_settings(CONFIGS / "postgres.example.toml")
    assert pg.db_url.startswith("postgresql+psycopg://")


def test_precedence(tmp_path, monkeypatch):
    cfg = tmp_path / "c.toml"
    cfg.write_text('data_dir = "from-file"\n[engine]\nmax_loras = 2\nmax_num_seqs = 3\n[server]\nport = 1\n')
    monkeypatch.setenv("LORAPLEX_ENGINE__MAX_LORAS", "5")
    monkeypatch.setenv("LORAPLEX_SERVER__PORT", "2")
    s = load_settings(cfg, server={"port": 3})
    assert s.data_dir == Path("from-file")  # file
    assert s.engine.max_num_seqs == 3  # file, next to an env override in the same table
    assert s.engine.max_loras == 5  # env beats file
    assert s.server.port == 3  # explicit (CLI flag) beats env


def test_secret_required_outside_demo(monkeypatch):
    monkeypatch.setenv("LORAPLEX_ENVIRONMENT", "production")
    with pytest.raises(ConfigError, match="secret_key must be set"):
        load_settings()
    monkeypatch.setenv("LORAPLEX_SECRET_KEY", "short")
    with pytest.raises(ConfigError, match="LORAPLEX_SECRET_KEY"):
        load_settings()
    monkeypatch.setenv("LORAPLEX_SECRET_KEY", "k" * 32)
    assert load_settings().resolved_secret() == "k" * 32


def test_demo_secret_is_generated_once_and_kept(tmp_path):
    s = load_settings(data_dir=tmp_path)
    first = s.resolved_secret()
    assert len(first) >= 32 and load_settings(data_dir=tmp_path).resolved_secret() == first
    assert (tmp_path / "secret_key").stat().st_mode & 0o077 == 0


@pytest.mark.parametrize("content, words", [
    ("[engine]\nmax_loras = 0\n", "engine.max_loras"),
    ("[engine]\nbogus = 1\n", "engine.bogus"),
    ("environment = \"staging\"\n", "environment"),
    ("[server]\nport = \"http\"\n", "server.port"),
])
def test_invalid_config_says_which_field(tmp_path, content, words):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(content)
    with pytest.raises(ConfigError, match=words.replace(".", r"\.")):
        load_settings(cfg)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "nope.toml")
