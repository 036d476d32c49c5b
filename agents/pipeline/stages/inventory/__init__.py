"""The ``inventory`` stage (``stage.run``): the traced operators (``model``) classified against the target's
operator library (``classify``)."""
