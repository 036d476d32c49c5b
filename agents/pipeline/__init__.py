"""The adaptation pipeline: one module per stage (plan, load, inventory, align, serve, bench, env), each
``run(ctx: StageContext) -> dict`` returning its section of the stage report (DESIGN.md §6)."""
