"""One harness for the tests and the benchmarks: real servers, started once, the same way everywhere.

    postgres.PgServer     a private PostgreSQL server (own port and directory; stop/start it freely)
    postgres.create_database / drop_database
                          a throw-away database on a shared server (each test its own)
    serve.ServeProcess    ``loraplex serve`` in its own process (own port, data dir, log)
    ray.ServeCluster      ``loraplex serve --replicas N`` on a local Ray of its own (own ports, temp dir,
                          process group; stopped with everything it started)
    net                   free ports and raw-socket HTTP probes (one keep-alive connection, early refusals)
    xdist_groups          which tests share a pytest-xdist worker, costliest groups first
    examples              Hypothesis example counts: all in the whole suite, a fifth in the inner loop

Tests import it as ``harness`` (``tests/`` is on ``sys.path`` through the root conftest); a benchmark
adds ``tests/`` to ``sys.path`` first. Nothing here imports pytest: a failure raises ``HarnessError``
with the server's log tail, which pytest reports like any error.
"""


class HarnessError(RuntimeError):
    """A server of the harness did not start (the message carries its log tail)."""
