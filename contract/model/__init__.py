"""A model as its ``config.json`` describes it, without torch: the parsed spec (``spec``), exact parameter counts
(``params``, ``vision_params``) and which code runs it (``native``: a native family or the transformers
fallback)."""
