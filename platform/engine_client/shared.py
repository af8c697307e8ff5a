"""Pieces both engine clients compose: where the base model is, adapter validation against it,
sampling parameters with their grammar compiled, and engine errors as platform errors."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from loraplex.platform.engine_client.protocol import AdapterFacts, AdapterInvalid
from loraplex.platform.errors import BadRequest, NotFound, PlatformError, RateLimited, ServiceUnavailable
from loraplex.platform.settings import Settings

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from loraplex.engine import RequestLimits, SamplingParams, StructuredOutputManager

log = logging.getLogger("loraplex.platform.engine")

TINY_RANDOM_MODEL = "tiny-random"


def demo_model_dir(settings: Settings) -> Path:
    """Where the embedded SmolLM2 checkpoint lives once converted (inside the data directory)."""
    from loraplex.engine import DEMO_MODEL_NAME

    return settings.data_dir / "models" / DEMO_MODEL_NAME


def resolve_model_dir(settings: Settings) -> Path:
    """The configured base model; empty = SmolLM2-135M-Instruct converted once into the data
    directory; ``tiny-random`` = the random-weight demo model (tiny shapes, no package needed)."""
    if settings.engine.model == TINY_RANDOM_MODEL:
        from loraplex.engine import ensure_demo_model

        return Path(ensure_demo_model(settings.data_dir / "demo-model"))
    if settings.engine.model:
        path = Path(settings.engine.model).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"engine.model {path} is not a directory")
        return path
    from loraplex.engine import ensure_demo_checkpoint

    return ensure_demo_checkpoint(demo_model_dir(settings))


def validate_adapter(path: Path, model_dir: Path | None, max_lora_rank: int) -> AdapterFacts:
    if model_dir is None:
        raise ServiceUnavailable("adapters cannot be validated: the inference engine is disabled on this server")
    from loraplex.engine import AdapterValidationError, validate_adapter_dir

    try:
        info = validate_adapter_dir(str(path), str(model_dir), max_lora_rank)
    except AdapterValidationError as exc:
        raise AdapterInvalid(f"adapter refused: {exc}", param="file") from None
    return AdapterFacts(
        rank=int(info.rank),
        alpha=float(info.alpha),
        target_modules=sorted(info.target_modules),
        use_rslora=bool(info.use_rslora),
        base_model=str(info.base_model_name_or_path or ""),
    )


def max_prompt_chars(tokenizer: PreTrainedTokenizerBase, max_model_len: int) -> int:
    """A prompt longer than this many characters cannot fit the context whatever it says:
    ``max_model_len`` tokens, each at most as long as the vocabulary's longest token (a byte-level
    token covers one byte, and a character is at least one byte). Checked before tokenizing."""
    longest = max((len(t) for t in tokenizer.get_vocab()), default=1)
    return max_model_len * max(longest, 1)


def check_sampling(
    params: SamplingParams,
    tenant_id: str | None,
    structured: StructuredOutputManager,
    limits: RequestLimits | None = None,
) -> None:
    """Refuse what the engine would refuse, before the request reserves quota or reaches an engine:
    the per-request limits, and a structured-output spec that does not compile (compiled here by
    ``structured``, the engine's own code and cache, charged to ``tenant_id``)."""
    from loraplex.engine import BusyError, InvalidRequestError, check_request_limits

    if limits is not None:  # before compiling
        try:
            check_request_limits(params, limits)
        except InvalidRequestError as exc:
            raise platform_error(exc) from None
    if params.structured_output is not None:
        try:
            structured.compile(params.structured_output, tenant=tenant_id)
        except (InvalidRequestError, BusyError) as exc:
            raise platform_error(exc) from None


def structured_compiler(tokenizer: PreTrainedTokenizerBase, model_dir: Path) -> StructuredOutputManager:
    """The engine's grammar compiler for this base model, built where no engine runs (the ingress):
    same tokenizer, vocabulary size and stop tokens as the replicas' engines."""
    from loraplex.engine import ModelConfig, StructuredOutputManager

    mc = ModelConfig.from_dir(str(model_dir))
    eos = set(mc.eos_token_ids)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        eos.add(int(tokenizer.eos_token_id))
    return StructuredOutputManager(tokenizer, mc.vocab_size, eos)


def platform_error(exc: Exception) -> PlatformError:
    from loraplex.engine import BusyError, EngineDeadError, InvalidRequestError, UnknownAdapterError

    if isinstance(exc, PlatformError):
        return exc
    if isinstance(exc, UnknownAdapterError):
        return NotFound(str(exc), param="model", code="model_not_found")
    if isinstance(exc, InvalidRequestError):
        return BadRequest(str(exc), param=exc.param)
    if isinstance(exc, BusyError):
        retry = max(1, round(exc.retry_after_s))
        return RateLimited(str(exc), param=exc.param, headers={"Retry-After": str(retry)})
    if isinstance(exc, EngineDeadError):
        return ServiceUnavailable(
            f"the inference engine is not running: {exc}", code="engine_unavailable", headers={"Retry-After": "5"}
        )
    log.exception("unexpected engine error")
    return ServiceUnavailable(f"the inference engine failed: {type(exc).__name__}: {exc}")
