"""The ``align`` stage (``stage.run``) and its parts: operator checks (``ops``, against the float64 references of
``refs``), layers, end to end (``e2e``), the KV cache (``kv``), the image path (``vision``) and compiled against
eager (``compiled``)."""
