"""Observability: request records, logs, request ids and Prometheus metrics."""
