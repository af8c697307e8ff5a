"""loraplex's benchmarks, run as modules from the repository root: ``python -m benchmarks.engine.throughput``.
README.md is the index (what each measures, how long it takes, which docs table it feeds)."""
