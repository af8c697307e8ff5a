"""Settings: defaults = configs/default.toml; TOML < environment < explicit overrides; clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from loraplex.platform.settings import ConfigError, load_settings

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    import os

    for name in [
        n
        for n in os.environ
        if n.startswith("LORAPLEX_") and not n.startswith("LORAPLEX_TEST") and n != "LORAPLEX_REQUIRE_POSTGRES"
    ]:
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


@pytest.mark.parametrize(
    "content, words",
    [
        ("[engine]\nmax_loras = 0\n", "max_loras must be a positive integer"),
        ("[engine]\nbogus = 1\n", "engine.bogus"),
        ('environment = "staging"\n', "environment"),
        ('[server]\nport = "http"\n', "server.port"),
        ('[engine]\ndtype = "float64"\n', "dtype must be"),
        ('[engine]\nschedulng_policy = "fair"\n', "engine.schedulng_policy"),
        ('[engine]\nscheduling_policy = "lifo"\n', "scheduling_policy"),
        ("[engine.extra]\nkv_cache_memory_gb = 1\n", "engine.extra"),
    ],
)
def test_invalid_config_says_which_field(tmp_path, content, words):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(content)
    with pytest.raises(ConfigError, match=words.replace(".", r"\.")):
        load_settings(cfg)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "nope.toml")


def test_every_engine_field_is_a_setting_with_the_engines_default(monkeypatch):
    from loraplex.engine.config import EngineConfig

    s = load_settings()
    for name, default in EngineConfig.field_defaults().items():
        assert getattr(s.engine, name) == default, name
    monkeypatch.setenv("LORAPLEX_ENGINE__VTC_OUTPUT_WEIGHT", "3.5")
    monkeypatch.setenv("LORAPLEX_ENGINE__ENABLE_PREFIX_CACHING", "true")
    s = load_settings(engine={"fair_share_preemption": False})
    assert s.engine.vtc_output_weight == 3.5 and s.engine.enable_prefix_caching is True
    assert s.engine.fair_share_preemption is False


def test_int8_and_speculative_engine_keys_reach_the_engine(tmp_path, monkeypatch):
    from loraplex.platform.settings import engine_config_kwargs

    cfg = tmp_path / "c.toml"
    cfg.write_text('[engine]\nquantization = "int8"\nspeculative_method = "ngram"\nnum_speculative_tokens = 6\n')
    monkeypatch.setenv("LORAPLEX_ENGINE__SPECULATIVE_ADAPTIVE", "false")
    kw = engine_config_kwargs(load_settings(cfg).engine)
    assert (kw["quantization"], kw["speculative_method"], kw["num_speculative_tokens"], kw["speculative_adaptive"]) == (
        "int8",
        "ngram",
        6,
        False,
    )
    cfg.write_text('[engine]\nspeculative_method = "draft"\n')  # a draft method without a draft model
    with pytest.raises(ConfigError, match="draft_model"):
        load_settings(cfg)


def test_w8a8_quantization_from_toml_and_env(tmp_path, monkeypatch):
    from loraplex.platform.settings import engine_config_kwargs

    cfg = tmp_path / "c.toml"
    cfg.write_text('[engine]\nquantization = "w8a8"\n')
    assert engine_config_kwargs(load_settings(cfg).engine)["quantization"] == "w8a8"
    monkeypatch.setenv("LORAPLEX_ENGINE__QUANTIZATION", "w8a8")
    assert engine_config_kwargs(load_settings().engine)["quantization"] == "w8a8"
    monkeypatch.setenv("LORAPLEX_ENGINE__QUANTIZATION", "w8a4")
    with pytest.raises(ConfigError, match="w8a8"):  # the message lists the methods
        load_settings()
