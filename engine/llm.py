"""``LLM``: the offline, synchronous API (vLLM-like).

llm = LLM(model="path/to/checkpoint", max_num_seqs=32)
outs = llm.generate(["Hello", "Bonjour"], SamplingParams(max_tokens=32, temperature=0))
print(outs[0].text)
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

from . import runtime_env
from .config import EngineConfig
from .llm_engine import LLMEngine
from .outputs import OutputKind, RequestOutput
from .request import EngineRequest
from .sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str, **engine_args: Any):
        config = EngineConfig(model=model, **engine_args)
        # The fast CPU runtime (tcmalloc + Intel OpenMP) must be loaded at process start. The
        # process is the user's: say how to start it so, never restart it (runtime_env.py).
        if config.torch_device.type == "cpu":
            runtime_env.warn_if_missing("LLM(...)")
        self.engine = LLMEngine(config)

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def add_adapter(self, name: str, path: str) -> None:
        self.engine.lora.add_adapter(name, path)

    def remove_adapter(self, name: str) -> None:
        self.engine.lora.remove_adapter(name)

    def list_adapters(self) -> list[str]:
        return self.engine.lora.list_adapters()

    def generate(
        self,
        prompts: Seq[str | list[int]],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        adapters: Seq[str | None] | None = None,
        tenants: Seq[str] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion in continuous batches; outputs come back in prompt order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # a single prompt
        n = len(prompts)
        params = _per_prompt(sampling_params or SamplingParams(), n, "sampling_params")
        adapters = _per_prompt(adapters, n, "adapters") if adapters is not None else [None] * n
        tenants = _per_prompt(tenants, n, "tenants") if tenants is not None else ["default"] * n
        ids = []
        try:
            for i, prompt in enumerate(prompts):
                req = self.engine.add_request(
                    EngineRequest(
                        prompt, params[i], adapter=adapters[i], tenant_id=tenants[i], output_kind=OutputKind.FINAL_ONLY
                    )
                )
                ids.append(req.request_id)
        except Exception:
            for rid in ids:  # all-or-nothing: don't leave half a batch running
                self.engine.abort_request(rid)
            raise
        done: dict[str, RequestOutput] = {}
        while len(done) < n:
            for out in self.engine.step():
                if out.finished:
                    done[out.request_id] = out
        return [done[rid] for rid in ids]


def _per_prompt(value: Any, n: int, name: str) -> list:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{name} has {len(value)} entries for {n} prompts")
        return list(value)
    return [value] * n
