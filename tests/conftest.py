"""Shared test set-up. Tiny models are built locally with transformers (never downloaded)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

# Make CPU thread use predictable on the 2-core CI machine (one xdist worker: see pytest_configure).
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _has_cuda() -> bool:
    # No NVIDIA device node: no CUDA, known without importing torch (seconds of CPU in the xdist
    # controller, which runs no test and otherwise never imports it).
    if not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")):
        return False
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


# Without a GPU, Triton kernels run in the interpreter on CPU tensors. It must be set before the
# first `import triton` anywhere in the session, hence here, at the root.
if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _share_httpx_default_tls_context() -> None:
    """Every ``httpx.Client()`` with default verification builds a new TLS context and parses
    certifi's ~150 CA certificates into it: ~30 ms of CPU each, and the suite makes thousands (each
    test's openai client, its admin ``httpx.Client``, every one-shot ``httpx.post``, and the S3
    source's client in every ``build_context``) although every test talks plain http on loopback.
    Here they share one such context, built once per process; it is the same configuration httpx
    would build (a client passing ``verify=...`` or ``cert=...`` still gets its own), so a handshake,
    where one happens, verifies exactly as before. The one thing httpcore changes on a context is
    its ALPN list, at each handshake, and nothing in the repository asks for HTTP/2, so every client
    sets the same list."""
    try:
        import httpx._transports.default as transport
    except ImportError:
        return
    build = getattr(transport, "create_ssl_context", None)
    if build is None or getattr(build, "_loraplex_shared", False):
        return
    shared: dict[tuple[str, str], object] = {}

    def create_ssl_context(verify=True, cert=None, trust_env=True):
        if verify is not True or cert is not None or not trust_env:
            return build(verify=verify, cert=cert, trust_env=trust_env)
        # the CA bundle httpx reads: certifi's, or the one SSL_CERT_FILE / SSL_CERT_DIR name
        where = (os.environ.get("SSL_CERT_FILE", ""), os.environ.get("SSL_CERT_DIR", ""))
        if where not in shared:
            shared[where] = build(verify=verify, cert=cert, trust_env=trust_env)
        return shared[where]

    create_ssl_context._loraplex_shared = True  # type: ignore[attr-defined]
    transport.create_ssl_context = create_ssl_context


_share_httpx_default_tls_context()


# A test that starts a process, a cluster or a browser through these fixtures is slow whatever its
# module says (modules that start them otherwise carry ``pytestmark = pytest.mark.slow``).
SLOW_FIXTURES = frozenset({"serve_process", "private_postgres", "browser", "page", "signed_in", "cluster"})


# Modules whose tests check what the engine and the HTTP layer answer (tool calls, grammars, the
# OpenAI surface), where the control-plane database only looks up the tenant, key and adapter: their
# PostgreSQL runs repeat the SQLite ones through the same code. CI runs both backends; the inner loop
# keeps SQLite. (Modules about storage, quotas, billing and the ledger keep both in the inner loop.)
DATABASE_AGNOSTIC_MODULES = (
    "tests/platform/test_tool_calling.py::",
    "tests/platform/test_openai_surface.py::",
    "tests/platform/test_vllm_extensions.py::",  # request extensions honoured or refused by name
    "tests/platform/test_hardening_routes.py::",  # bounds checked before templating (in-process quotas)
    "tests/platform/test_hostile_round4_body_items.py::",  # list bounds applied before validation
    "tests/platform/test_openai_errors.py::",  # error codes, params and wording as OpenAI's
)


def pytest_configure(config: pytest.Config) -> None:
    # LORAPLEX_TEST_TIMELINE=prefix: a per-worker timeline of the run (tests/harness/timeline.py).
    from harness.timeline import register

    register(config)
    # The inner loop runs each Hypothesis property with a fifth of its examples (harness/examples.py);
    # set before collection, where the tests' @settings are evaluated (xdist workers do the same).
    if config.option.markexpr.strip() == "not slow":
        os.environ.setdefault("LORAPLEX_HYPOTHESIS_PROFILE", "dev")
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    if workers > 1:
        # Several xdist workers (scripts/test.sh: three on two cores) keep both cores busy, so each
        # worker, and every server it starts, computes on one thread: more threads each would
        # oversubscribe the cores and every OpenMP barrier would wait for a descheduled thread. (torch is already imported above.)
        import torch

        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """An xdist worker leaves at once when its session is over. Its results went to the controller
    with ``workerfinished`` (sent at the end of the session, before this hook); what a normal exit
    adds is pytest's last garbage collections (~2 s with models and apps in the heap) and the
    interpreter's finalization of torch, tokenizers and thread pools (~5 s), during which the
    controller waits for the process, and nothing it could report reaches the controller any more.
    Not when something needs the normal exit: coverage data written at exit, a Ray session not shut
    down, multiprocessing children to reap."""
    if not hasattr(config, "workerinput") or getattr(config.option, "cov_source", None):
        return
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "is_initialized", lambda: False)():
        return
    mp = sys.modules.get("multiprocessing")
    if mp is not None and mp.active_children():
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


_MODULE_SLOW = re.compile(r"^pytestmark\s*=.*\bpytest\.mark\.slow\b", re.MULTILINE)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The inner loop (exactly ``-m "not slow"``) does not even import a module marked slow as a
    whole (``pytestmark = ... pytest.mark.slow``): its tests would all be deselected, and importing
    it (Ray, Playwright, the agent frameworks) cost each xdist worker ~9 CPU-s of collection."""
    if config.option.markexpr.strip() != "not slow" or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    try:
        return True if _MODULE_SLOW.search(collection_path.read_text(encoding="utf-8")) else None
    except OSError:
        return None


@pytest.hookimpl(optionalhook=True)  # xdist may be absent (-p no:xdist)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Our groups decide which tests share a worker (tests/harness/xdist_groups.py says why)."""
    from harness.xdist_groups import GroupScheduling

    return GroupScheduling(config, log)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        if item.nodeid.startswith(DATABASE_AGNOSTIC_MODULES) and item.get_closest_marker("postgres"):
            item.add_marker(pytest.mark.slow)
        if item.nodeid.startswith("tests/demo/"):
            # The real 135M model: its session fixtures convert the GGUF and train two adapters
            # (about a minute quiet, over 10 on the loaded shared machine), inside the first test's
            # deadline.
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.timeout(2400))
