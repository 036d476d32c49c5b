"""The pipeline's stages, one module (or package, when a stage is big) each: plan, load, inventory, align, serve,
bench, eval, soak, comm, env, reference. A stage imports support leaves, the runtime and the rules, never another
stage: what one stage hands the next goes through ``ctx.state`` (``support/state.py``) and ``ctx.results``."""
