"""The server's request handlers, one module per kind of route; each handler takes the ``ServerState`` and the
request (``routes.py`` binds them)."""
