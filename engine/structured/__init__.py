"""Grammar-constrained decoding: compiled grammars, per-request matchers, the per-step token mask."""
