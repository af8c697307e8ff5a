"""Prompt-lookup (n-gram) proposer: no extra model.

Find the most recent earlier occurrence of the sequence's last ``n`` tokens (longest ``n`` first,
from ``max_n`` down to ``min_n``) and propose the tokens that followed it. Text that copies spans of
its context (editing, summarising, code, quoting the prompt) gets long accepted runs for free;
free-form text finds no match and proposes nothing, which costs nothing.
"""

from __future__ import annotations


class NgramProposer:
    def __init__(self, max_n: int = 4, min_n: int = 1, max_lookback: int = 4096):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.max_n, self.min_n = max_n, min_n
        self.max_lookback = max_lookback  # bound the scan: a step must stay cheap on long contexts

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        """Up to ``k`` tokens continuing ``token_ids``; [] when no n-gram recurs."""
        L = len(token_ids)
        if k <= 0 or L < self.min_n + 1:
            return []
        lo = max(0, L - self.max_lookback)
        for n in range(min(self.max_n, L - 1), self.min_n - 1, -1):
            suffix = token_ids[L - n :]
            first = suffix[0]
            # Latest start i < L - n with token_ids[i:i+n] == suffix (the suffix itself excluded).
            i = L - n - 1
            while i >= lo:
                if token_ids[i] == first and token_ids[i : i + n] == suffix:
                    follow = token_ids[i + n : i + n + k]
                    if follow:
                        return follow
                i -= 1
        return []
