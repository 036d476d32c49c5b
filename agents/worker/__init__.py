"""Agent worker: the Celery tasks of the agent, the only bridge between portal and runtime."""
