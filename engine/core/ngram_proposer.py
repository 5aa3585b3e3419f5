"""n-gram (prompt lookup) drafts: guess the next tokens from an earlier occurrence of the last ones.

The sequence's last n tokens (prompt_lookup_max >= n >= prompt_lookup_min) are looked up in its
own earlier tokens, prompt and output alike; the longest match wins (among equally long matches
the latest that has a whole draft after it), and the tokens that followed it are the draft. Text that quotes, edits or
summarises its input repeats it, so such drafts are often right; verifying them costs one forward
pass over a few more tokens.

Vectorised with numpy: the positions where the last `prompt_lookup_min` tokens occur are found in
one pass; each candidate (few) is then extended backwards up to `prompt_lookup_max`.
"""
from __future__ import annotations

import numpy as np

from common.speculative_config import SpeculativeConfig


class NgramProposer:
    def __init__(self, config: SpeculativeConfig):
        self.min_n = config.prompt_lookup_min
        self.max_n = config.prompt_lookup_max

    def propose(self, token_ids: list[int], max_draft: int) -> list[int]:
        """Up to `max_draft` tokens that may follow `token_ids`; [] when nothing matches."""
        n_total = len(token_ids)
        if max_draft <= 0 or n_total <= self.min_n:
            return []
        tokens = np.asarray(token_ids, dtype=np.int64)
        suffix = tokens[n_total - self.min_n:]
        # windows [i, i + min_n) for i < n_total - min_n (the suffix itself excluded)
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: n_total - 1], self.min_n)
        starts = np.flatnonzero((windows == suffix).all(axis=1))
        if not len(starts):
            return []
        best_start, best = -1, (0, 0)
        for start in starts[::-1]:  # latest first: it wins ties
            length = self.min_n
            while (length < self.max_n and start - (length - self.min_n) - 1 >= 0
                   and tokens[start - (length - self.min_n) - 1] == tokens[n_total - length - 1]):
                length += 1
            # the longest match; among those, one that has a whole draft after it (a run of one
            # token matches best at its very end, with a single token to follow)
            score = (length, min(n_total - (start + self.min_n), max_draft))
            if score > best:
                best_start, best = int(start), score
                if score == (self.max_n, max_draft):
                    break
        follow = best_start + self.min_n  # the first token after the matched window
        return tokens[follow: follow + max_draft].tolist()
