"""Incremental detokenization against one-shot decoding, with UTF-8 characters split over tokens."""

from __future__ import annotations

import random

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from loraplex.engine.detokenizer import DetokState, append_text


class _Seq:  # what append_text reads and writes
    def __init__(self) -> None:
        self.output_token_ids: list[int] = []
        self.text = ""


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE with no merges: every token is ONE byte, so every multi-byte character
    arrives split across 2-4 tokens."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


TEXT = "naïve café — 東京 🙂 ok ∑x² ü"


def test_split_utf8_characters_never_leak_replacement_chars():
    tok = byte_tokenizer()
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert len(ids) == len(TEXT.encode("utf-8"))  # one token per byte
    seq, state, deltas = _Seq(), DetokState(), []
    for t in ids:
        seq.output_token_ids.append(t)
        deltas.append(append_text(tok, seq, state))
    assert "".join(deltas) == TEXT == seq.text
    assert all("\ufffd" not in d for d in deltas)
    # the 4-byte emoji came out whole, in the delta of its last byte
    assert "🙂" in deltas[len("naïve café — 東京 🙂".encode()) - 1]


def test_random_token_streams_match_one_shot_decode():
    tok = byte_tokenizer()
    rng = random.Random(0)
    vocab = tok.vocab_size
    for _ in range(20):
        seq, state = _Seq(), DetokState()
        for _ in range(rng.randint(1, 60)):
            seq.output_token_ids.append(rng.randrange(vocab))
            append_text(tok, seq, state)
        full = tok.decode(seq.output_token_ids)
        # invalid byte sequences stay pending; what was emitted is always a prefix of the decode
        assert full.startswith(seq.text) or full.rstrip("\ufffd").startswith(seq.text)
        assert seq.text == full[: len(seq.text)]
