"""Engine ``TokenLogprobs`` -> OpenAI's layouts: chat's ``content`` list, legacy completions'
parallel lists (with ``echo``: the prompt's tokens first), and vLLM's ``prompt_logprobs``.

Pure (a tokenizer in, dicts out): each layout is tested on hand-made logprobs without an engine."""

from __future__ import annotations

from typing import Any


def _byte_decoder() -> dict[str, int]:
    # GPT-2's reversible byte <-> printable-char table, as every byte-level BPE uses it.
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_DECODER = _byte_decoder()


class LogprobsFormatter:
    """One response's logprobs formatting (token texts are decoded once per token id)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self._cache: dict[int, str] = {}

    def text(self, tid: int) -> str:
        s = self._cache.get(tid)
        if s is None:
            s = self._cache[tid] = self._tok.decode([tid])
        return s

    def token_bytes(self, tid: int) -> list[int]:
        """The token's real bytes: a byte-level BPE piece maps back char by char (a piece that
        splits a UTF-8 character decodes to U+FFFD, its bytes do not); other vocabularies decode."""
        piece = self._tok.convert_ids_to_tokens(tid)
        if isinstance(piece, str) and piece and all(ch in _BYTE_DECODER for ch in piece):
            return [_BYTE_DECODER[ch] for ch in piece]
        return list(self.text(tid).encode("utf-8"))

    def chat(self, lps: list) -> dict:
        def entry(tid: int, lp: float) -> dict:
            return {"token": self.text(tid), "logprob": lp, "bytes": self.token_bytes(tid)}

        return {
            "content": [{**entry(x.token_id, x.logprob), "top_logprobs": [entry(t, v) for t, v in x.top]} for x in lps],
            "refusal": None,
        }

    def prompt(self, lps: list | None, k: int) -> list | None:
        """vLLM's prompt_logprobs: None for the first prompt token, then per token a dict keyed by
        token id: the prompt token itself and the top-``k``, each with logprob, rank and text."""
        if lps is None:
            return None
        out: list[dict | None] = [None]
        for x in lps:
            entry = {str(x.token_id): {"logprob": x.logprob, "rank": x.rank, "decoded_token": self.text(x.token_id)}}
            for rank, (t, v) in enumerate(x.top[:k], 1):
                entry.setdefault(str(t), {"logprob": v, "rank": rank, "decoded_token": self.text(t)})
            out.append(entry)
        return out

    def completion(self, lps: list, offset: int) -> dict:
        """Legacy completions' lists for generated tokens whose text starts at ``offset``."""
        tokens = [self.text(x.token_id) for x in lps]
        return {
            "tokens": tokens,
            "token_logprobs": [x.logprob for x in lps],
            "top_logprobs": [{self.text(t): v for t, v in x.top} for x in lps],
            "text_offset": _offsets(tokens, offset),
        }

    def echoed_prompt(self, prompt_ids: list[int], lps: list, k: int) -> dict:
        """The legacy lists for an echoed prompt (OpenAI, vLLM): every prompt token, the first with
        a null logprob and null top (nothing predicts it), then token p's logprob given the ones
        before it and its top-``k`` (``lps[p - 1]``, the engine's prompt logprobs)."""
        tokens = [self.text(t) for t in prompt_ids]
        # A request that ended before its prompt logprobs came (the generation timeout) has
        # none: its prompt tokens are listed with null logprobs rather than left out.
        missing = [None] * max(0, len(prompt_ids) - 1 - len(lps))
        return {
            "tokens": tokens,
            "token_logprobs": [None] + [x.logprob for x in lps] + missing,
            "top_logprobs": [None] + [{self.text(t): v for t, v in x.top[:k]} for x in lps] + missing,
            "text_offset": _offsets(tokens, 0),
        }


def _offsets(tokens: list[str], start: int) -> list[int]:
    out = []
    for s in tokens:
        out.append(start)
        start += len(s)
    return out


def concat(first: dict, then: dict) -> dict:
    """Two legacy logprobs blocks, one after the other (echoed prompt, then the completion)."""
    return {key: first[key] + then[key] for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
