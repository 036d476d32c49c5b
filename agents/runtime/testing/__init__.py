"""Test fixtures of the runtime: deterministic random-weight models and a locally trained tokenizer."""
