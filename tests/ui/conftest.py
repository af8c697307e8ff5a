"""Admin web page tests: real headless Chromium (Playwright) against a real uvicorn server of the
platform on 127.0.0.1, with the demo model engine and a temporary SQLite data directory.

Chromium comes from Debian (`apt-get install chromium`); Playwright's own browser download is not
used. Without /usr/bin/chromium these tests skip, unless LORAPLEX_REQUIRE_BROWSER=1 (CI) fails them.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import httpx
import pytest
from harness.live import LiveServer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))  # platform_helpers
sys.path.insert(0, str(Path(__file__).resolve().parent))  # ui_helpers
from platform_helpers import ADMIN_KEY, adapter_files, admin_headers, make_peft_adapter  # noqa: E402

CHROMIUM = os.environ.get("LORAPLEX_CHROMIUM", "/usr/bin/chromium")
REQUIRE_BROWSER = os.environ.get("LORAPLEX_REQUIRE_BROWSER") == "1"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _browser_missing_reason() -> str | None:
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return f"{CHROMIUM} not found (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright Python package is not installed (pip install -e .[test])"
    return None


@pytest.fixture(scope="session")
def _need_browser():
    reason = _browser_missing_reason()
    if reason and REQUIRE_BROWSER:
        pytest.fail(f"LORAPLEX_REQUIRE_BROWSER=1 but {reason}")
    if reason:
        pytest.skip(f"admin UI tests need a browser: {reason}")


@pytest.fixture(scope="session")
def ui_demo_model_dir(tmp_path_factory) -> Path:
    from loraplex.engine.demo_model import ensure_demo_model

    return Path(ensure_demo_model(tmp_path_factory.mktemp("ui-models") / "demo"))


@pytest.fixture(scope="session")
def ui_adapter_files(ui_demo_model_dir, tmp_path_factory) -> dict[str, bytes]:
    """A real PEFT adapter (rank 4 on q/v) made with peft on the demo model."""
    out = make_peft_adapter(
        ui_demo_model_dir, tmp_path_factory.mktemp("ui-adapters") / "good", r=4, alpha=8, targets=("q_proj", "v_proj")
    )
    return adapter_files(out)


class Server:
    def __init__(self, url: str, ctx) -> None:
        self.url = url
        self.ctx = ctx

    def admin(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=admin_headers(), timeout=60)


@pytest.fixture(scope="session")
def server(ui_demo_model_dir, tmp_path_factory):
    """`loraplex serve` in-process: the real app with the demo model engine on a fresh SQLite DB."""
    from loraplex.platform.app import build_context, create_app
    from loraplex.platform.settings import load_settings

    data_dir = tmp_path_factory.mktemp("ui-data")
    settings = load_settings(
        data_dir=data_dir,
        admin_key=ADMIN_KEY,
        engine={
            "model": str(ui_demo_model_dir),
            "max_num_seqs": 8,
            "max_loras": 4,
            "max_lora_rank": 16,
            "kv_cache_memory_gb": 0.05,
        },
        uploads={"max_upload_bytes": 2 * 1024 * 1024, "max_members": 8, "max_unpacked_bytes": 4 * 1024 * 1024},
        adapters={"file_roots": [tempfile.gettempdir()]},  # the file:// test folders
    )
    ctx, _ = build_context(settings)
    app = create_app(ctx, owns_engine=True)
    with LiveServer(app, ctx) as srv:
        yield Server(srv.url, ctx)


@pytest.fixture(scope="module")  # not session: see tests/harness/xdist_groups.py
def browser(_need_browser):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, server):
    """A fresh browser context per test (so sessionStorage starts empty); console errors fail the test."""
    context = browser.new_context(viewport={"width": 1400, "height": 900}, locale="en-US", timezone_id="UTC")
    context.set_default_timeout(15_000)
    pg = context.new_page()
    problems: list[str] = []
    pg.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    pg.on(
        "console",
        lambda msg: (
            problems.append(f"console.{msg.type}: {msg.text}")
            if msg.type == "error" and "Failed to load resource" not in msg.text
            else None
        ),
    )
    yield pg
    context.close()
    assert not problems, problems


@pytest.fixture
def signed_in(page, server):
    from ui_helpers import sign_in

    sign_in(page, server.url, ADMIN_KEY)
    return page
