"""Metrics (Prometheus), structured request logs and optional OpenTelemetry traces."""
