"""The ``align`` stage (``stage.run``) and its parts: operator checks (``ops``: the runtime's modules re-randomised
by ``probe``, checked by ``op_checks`` against the float64 references of ``refs``), layers, end to end (``e2e``),
the KV cache (``kv``), the image path (``vision``) and compiled against eager (``compiled``)."""
