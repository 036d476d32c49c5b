"""Agent side: the bundled inference runtime, the pipeline stages, and the Celery worker that bridges them."""
