"""OpenAI-compatible HTTP server over the engine."""

from agents.runtime.server.app import create_app

__all__ = ["create_app"]
