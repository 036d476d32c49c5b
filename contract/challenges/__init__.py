"""The portal's challenges: the pool of items drawn from the bundled suites (``pool``), how raw outputs are
scored (``scoring``) and judged into verdicts (``verdicts``)."""
