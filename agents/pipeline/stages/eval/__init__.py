"""The ``eval`` stage (``stage.run``): the bundled suites and the needle against the reference, or the portal's
challenge items answered by the served target (``challenge``)."""
