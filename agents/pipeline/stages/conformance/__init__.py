"""The ``conformance`` stage (``stage.run``): the served OpenAI endpoint checked against the reference."""
