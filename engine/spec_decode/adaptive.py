"""Adaptive speculation length, per sequence.

Each sequence keeps an exponential moving average of its acceptance rate. Its next ``k`` is
``k_max`` scaled by that rate (at least 1); once the rate falls under ``off_below`` the sequence
stops speculating (proposals that are rejected cost a wider target forward and draft work for
nothing) and probes again with ``k = 1`` every ``probe_every`` steps, so a sequence whose text turns
repetitive later is picked up again. Per sequence, not batch-wide: one sequence's k then depends on
its own history only, which keeps seeded sampling reproducible whatever else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SpecState:
    rate: float = 1.0  # EWMA of accepted / proposed
    idle_steps: int = 0  # steps since the last proposal while switched off


class AdaptiveK:
    def __init__(
        self, k_max: int, enabled: bool = True, smoothing: float = 0.3, off_below: float = 0.15, probe_every: int = 8
    ):
        self.k_max, self.enabled = k_max, enabled
        self.smoothing, self.off_below, self.probe_every = smoothing, off_below, probe_every

    def next_k(self, state: SpecState) -> int:
        if not self.enabled:
            return self.k_max
        if state.rate < self.off_below:
            state.idle_steps += 1
            if state.idle_steps < self.probe_every:
                return 0
            state.idle_steps = 0
            return 1
        return max(1, min(self.k_max, round(self.k_max * state.rate + 0.49)))

    def update(self, state: SpecState, proposed: int, accepted: int) -> None:
        if proposed <= 0:
            return
        a = self.smoothing
        state.rate = (1 - a) * state.rate + a * (accepted / proposed)
