"""OutputProcessor: from sampled tokens to what callers receive.

Owns the text side of a request: incremental detokenization, stop strings (which end a sample in
the middle of a token's text, so they cannot be checked on token ids), and building
``RequestOutput``s in the request's ``OutputKind``. With DELTA only the tokens and text that are new
since the previous output travel (a long stream is not re-copied every step); while a sample could
still be cut by a stop string, the last ``len(stop) - 1`` characters are held back so that text
already sent is never taken back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .detokenizer import DetokState, append_text, find_stop_string, flush_text
from .outputs import CompletionOutput, OutputKind, RequestOutput
from .sequence import Request, Sequence


@dataclass
class _SampleState:
    detok: DetokState = field(default_factory=DetokState)
    tokens_sent: int = 0
    chars_sent: int = 0
    tokens_read: int = 0  # output tokens detokenized so far


@dataclass
class _RequestState:
    kind: OutputKind
    samples: dict[int, _SampleState]  # seq_id -> state
    hold_back: int  # chars held back while a stop string could still match


class OutputProcessor:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._states: dict[str, _RequestState] = {}

    def add(self, req: Request, kind: OutputKind) -> None:
        stops = req.params.stop
        self._states[req.request_id] = _RequestState(
            kind, {s.seq_id: _SampleState() for s in req.sequences}, max((len(s) for s in stops), default=1) - 1
        )

    def _streams_text(self, req: Request) -> bool:
        return self._states[req.request_id].kind is not OutputKind.FINAL_ONLY or bool(req.params.stop)

    def process_tokens(self, seqs: list[Sequence]) -> list[tuple[Sequence, str, bool]]:
        """Detokenize the new tokens of each sequence (when its request streams text or has stop
        strings). Returns (sequence, stop string, cut) for those that just hit a stop string: the
        caller finishes them in the scheduler. Their text is already cut at the stop. A step that
        emitted several tokens (speculation) is read token by token: a stop string completed by an
        earlier one drops the tokens after it (``cut``), so the output ends where plain decoding ends."""
        hits = []
        for seq in seqs:
            req = seq.request
            state = self._states.get(req.request_id)
            if state is None or not self._streams_text(req):
                continue
            sample = state.samples[seq.seq_id]
            n = seq.num_output_tokens
            steps = range(sample.tokens_read + 1, n + 1) if req.params.stop else (n,)
            sample.tokens_read = n
            for upto in steps:
                delta = append_text(self.tokenizer, seq, sample.detok, upto)
                if upto < req.params.min_tokens:
                    continue  # vLLM: stop strings count only once min_tokens were generated
                hit = find_stop_string(seq.text, req.params.stop, len(delta))
                if hit is not None:
                    idx, stop = hit
                    seq.text = seq.text[: idx + (len(stop) if req.params.include_stop_str_in_output else 0)]
                    cut = upto < n
                    if cut:
                        del seq.token_ids[seq.num_prompt_tokens + upto :]
                        sample.tokens_read = upto
                    hits.append((seq, stop, cut))
                    break
        return hits

    def make_output(self, req: Request) -> RequestOutput | None:
        """The output to hand out for ``req`` after a step that touched it (None: nothing to send).
        Call ``finish`` instead once the request is finished."""
        state = self._states[req.request_id]
        if state.kind is OutputKind.FINAL_ONLY:
            return None
        out = self._build(req, state, final=False)
        if state.kind is OutputKind.DELTA and not any(o.token_ids or o.text for o in out.outputs):
            return None
        return out

    def finish(self, req: Request) -> RequestOutput:
        """The last output of ``req``; forgets its state."""
        state = self._states.pop(req.request_id, None)
        if state is None:  # never registered (failed at admission): a cumulative snapshot
            state = _RequestState(OutputKind.CUMULATIVE, {s.seq_id: _SampleState() for s in req.sequences}, 0)
        if state.kind is OutputKind.FINAL_ONLY and not req.params.stop:  # text never decoded so far
            for seq in req.sequences:
                seq.text = self.tokenizer.decode(seq.output_token_ids, skip_special_tokens=True)
        else:
            for seq in req.sequences:
                if not isinstance(seq.stop_reason, str):  # a stop string cut the text on purpose
                    flush_text(self.tokenizer, seq, state.samples.setdefault(seq.seq_id, _SampleState()).detok)
        return self._build(req, state, final=True)

    def _build(self, req: Request, state: _RequestState, final: bool) -> RequestOutput:
        outputs = []
        for seq in req.sequences:
            s = state.samples.setdefault(seq.seq_id, _SampleState())
            tokens = seq.output_token_ids
            if state.kind is OutputKind.DELTA:
                text_end = (
                    len(seq.text) if (final or seq.is_finished) else max(s.chars_sent, len(seq.text) - state.hold_back)
                )
                first_new = s.tokens_sent
                new_tokens, new_text = tokens[s.tokens_sent :], seq.text[s.chars_sent : text_end]
                s.tokens_sent, s.chars_sent = len(tokens), text_end
            else:
                first_new = 0
                new_tokens, new_text = list(tokens), seq.text
            outputs.append(
                CompletionOutput(
                    index=seq.index,
                    token_ids=new_tokens,
                    text=new_text,
                    finish_reason=seq.finish_reason,
                    stop_reason=seq.stop_reason,
                    logprobs=seq.logprobs[first_new : len(tokens)] if req.params.logprobs is not None else None,
                )
            )
        metrics = {
            "arrival_time": req.arrival_time,
            "first_token_time": req.first_token_time,
            "finish_time": req.finish_time,
            "num_cached_tokens": max((s.num_cached_tokens for s in req.sequences), default=0),
            "num_preemptions": sum(s.num_preemptions for s in req.sequences),
        }
        return RequestOutput(
            request_id=req.request_id,
            prompt_token_ids=req.prompt_token_ids,
            outputs=outputs,
            finished=final,
            adapter=req.adapter_name,
            tenant_id=req.tenant_id,
            metrics=metrics,
            error=req.error,
            kind=state.kind,
            prompt_logprobs=list(req.sequences[0].prompt_logprobs)
            if final and req.params.prompt_logprobs is not None
            else None,
        )
