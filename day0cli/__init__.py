"""The ``day0`` command: one entry point over both sides of the house.

It sits above the portal (``apps``, ``day0portal``) and the agents (``agents``) and may import either; nothing
imports it. ``main`` builds the parser from each side's command modules; ``demo`` (``day0 demo``) composes a
portal on the embedded default with a CPU agent, seeding the portal through ``demo_seed`` and, for the second
job (a real model), ``demo_real_model``."""
