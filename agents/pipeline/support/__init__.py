"""What several stages share: the stage context and the per-job state, layout and nodes, the server process, the
served endpoints' checks, the models and tokenizer, model backends, the collectives library, the report schema.
Support modules import each other only downward (``pyproject.toml``'s ``pipeline-support-layers`` contract)."""
