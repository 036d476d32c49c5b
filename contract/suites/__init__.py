"""The bundled eval suites: lm-eval task files (``day0_*.yaml`` + JSONL) read and scored as the harness does
(``tasks``), and the needle-in-a-haystack items (``needle``, ``needle_haystack.json``)."""
