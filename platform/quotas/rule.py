"""What one engine request may consume, the single rule used by admission's reservation, the quota
messages and the final bill's upper bound: its prompt tokens plus ``n`` completions of at most
``max_tokens`` each. A prompt list is one engine request per prompt, each priced by this rule."""

from __future__ import annotations


def request_cost(prompt_tokens: int, n: int, max_tokens: int) -> int:
    """Upper bound of the tokens (prompt + completions of every choice) one prompt may be billed."""
    return prompt_tokens + max(1, n) * max_tokens


RULE = "prompt + n x max_tokens"  # how 429 messages name the reserved amount
