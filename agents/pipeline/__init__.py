"""The adaptation pipeline: stages (``stages/``, one module or package per stage, each ``run(ctx: StageContext) ->
dict`` returning its section of the stage report, docs/stage-report.md) over a small support layer (``support/``), the
stage registry (``registry``), the runner that runs them in order (``runner``), a non-zero node's share of a
multi-host job (``follower``) and ``day0 adapt`` (``commands``)."""
