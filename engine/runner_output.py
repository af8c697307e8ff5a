"""What one step's model run produced (``ModelRunner.execute`` -> ``RunnerOutput``): tokens, logprobs
and counts only, for ``Scheduler.update_from_output`` to book. Its own module (vLLM v1's
``outputs.py``), so the scheduler and a simulation's fake model need not import the runner."""

from __future__ import annotations

from dataclasses import dataclass, field

from .sampler import TokenLogprobs
from .sequence import Sequence


@dataclass
class RunnerOutput:
    """What one step produced, for ``Scheduler.update_from_output`` to book."""

    # (sequence, its new tokens): one token, or for a speculating sequence its accepted drafts
    # followed by the target's own token. n > 1 followers appear right after their leader.
    sampled: list[tuple[Sequence, list[int]]] = field(default_factory=list)
    logprobs: dict[int, TokenLogprobs] = field(default_factory=dict)  # seq_id -> its sampled token's
    # seq_id -> the prompt logprobs of the positions this step computed (prompt_logprobs requests)
    prompt_logprobs: dict[int, list[TokenLogprobs]] = field(default_factory=dict)
    num_accepted: dict[int, int] = field(default_factory=dict)  # seq_id -> accepted drafts (speculating)
    grammar_finished: set[int] = field(default_factory=set)  # seq_ids whose grammar admits nothing more
    # seq_ids whose sampled rows' final hidden state was not finite (NaN / inf): their tokens are
    # noise, and the engine fails their requests instead of emitting them
    nonfinite: set[int] = field(default_factory=set)

    @property
    def num_tokens(self) -> int:
        return sum(len(tokens) for _, tokens in self.sampled)
