"""The rules the portal and the agents share: plain Python that both import and that imports neither.

Like a wire protocol under a client and a server, this package sits below ``apps``/``day0portal`` and below
``agents`` (runtime, pipeline, worker); it imports nothing of them, nor Django, torch, transformers or numpy
(``pyproject.toml``'s import contracts say so). Importing any of its modules loads only the standard library;
reading the bundled lm-eval task files (``suites.tasks.load_task``) needs PyYAML and Jinja2, the harness's formats.

- ``tiers`` (stage order, tier gates), ``thresholds`` (the versioned defaults and their ranges), ``verdicts``
  (whether a stage's report section is passing evidence), ``manifest`` (checksum manifests), ``challenges``
  (the portal's challenge pool and how it scores raw outputs), ``suites`` (the bundled eval suites);
- ``model`` (a ``config.json`` parsed, its parameters counted, which code runs it), ``hardware`` (accelerator
  specs and the bundled catalog under ``data/``), ``planner`` (memory per device of a TP × PP × EP layout),
  ``expert_balance`` (the bench section's routing balance);
- ``queues`` (the agent's task and queue names), ``jobspec`` (the payload an agent receives) and ``nodes`` (how
  many nodes a job may span, the ports they meet at)."""
