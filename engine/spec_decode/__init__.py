"""Speculative decoding: proposers (n-gram prompt lookup, draft model), acceptance (exact greedy,
rejection sampling), adaptive k, and the engine hooks that verify a whole batch in one forward."""

from .acceptance import verify_greedy, verify_sampled
from .adaptive import AdaptiveK, SpecState
from .decoder import SpeculativeDecoder
from .ngram import NgramProposer

__all__ = ["AdaptiveK", "NgramProposer", "SpecState", "SpeculativeDecoder", "verify_greedy", "verify_sampled"]
