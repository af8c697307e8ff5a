"""One harness for the tests and the benchmarks: real servers, started once, the same way everywhere.

    live.LiveServer       an ASGI app on a real uvicorn in a thread of this process (free port)
    serve.ServeProcess    ``loraplex serve`` in its own process (own port, data dir, log)
    ray.ServeCluster      ``loraplex serve --replicas N`` on a local Ray of its own (own ports, temp dir,
                          process group; stopped with everything it started)
    process.ServerProcess any HTTP server in its own process (the base of the three below and of the
                          ones above; a benchmark starts a peer's server with it)
    s3.MotoServer         a real S3 endpoint (moto's server); ``s3.RawStore`` one that misbehaves
    postgres.PostgresServer
                          a private PostgreSQL server (own port and directory; stop/start it freely)
    postgres.create_database / drop_database
                          a throw-away database on a shared server (each test its own)
    oidc.OIDCProvider     a real OpenID Connect provider (oidc-provider-mock) in a thread, PKCE enforced
    prometheus.PrometheusProcess
                          a real Prometheus scraping the servers of a test
    wait.wait_for         poll for a state with a generous deadline (never sleep "long enough")
    net                   free ports and raw-socket HTTP probes (one keep-alive connection, early refusals)
    xdist_groups          which tests share a pytest-xdist worker, costliest groups first
    examples              Hypothesis example counts: all in the whole suite, a fifth in the inner loop

Tests import it as ``harness`` (``tests/`` is on ``sys.path`` through the root conftest); benchmarks,
run as modules from the repository root (``python -m benchmarks.serving.adapter_scale``), import it
as ``tests.harness`` (the modules here import each other relatively, so both names work). Nothing
here imports pytest: a failure raises ``HarnessError`` with the server's log tail, which pytest
reports like any error.
"""


class HarnessError(RuntimeError):
    """A server of the harness did not start (the message carries its log tail)."""
