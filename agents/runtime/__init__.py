"""The bundled inference runtime: config → spec → plan, strict streaming loader, native model families with
tensor and expert parallelism, a generic `transformers` fallback, a paged-KV engine and an OpenAI-compatible
server. Imports nothing from Django or ``apps``; see STRUCTURE.md for the map and the life of a request."""
