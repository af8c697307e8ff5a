"""Helpers shared by the benchmarks: workloads and the engine driver (``workload``), real-text
prompts on the demo model (``real_text``), PEFT adapters written directly (``adapters``,
``peer_adapters``), paths (``paths``). Servers come from the test harness (``tests.harness``)."""
