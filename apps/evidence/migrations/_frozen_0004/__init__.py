"""Migration 0004's verdict rules, frozen (``base``, ``rules``, ``thresholds``)."""
