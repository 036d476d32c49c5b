"""Observability shared by every process (portal, worker, pipeline, runtime): OpenTelemetry spans and log
context. Standard library and the OpenTelemetry API/SDK only; it imports nothing of the project."""
