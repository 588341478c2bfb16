"""The public entry points: ``wrap`` a Hugging Face causal LM, then ``generate``."""

from __future__ import annotations

import functools

import torch

from dspark.checks import check_int
from dspark.cost_models.auto import BASE_ROWS
from dspark.cost_models.profiling import one_row_draft_seconds
from dspark.fast_path import FastPath, on_cpu
from dspark.kv import check_cache_support
from dspark.loop import PREFILL_CHUNK_TOKENS, LoopSpec, run_generation
from dspark.protocols import DRAFTER_HOOKS, POLICY_HOOKS, ConfidenceEstimator, CostModel, Drafter, VerifyPolicy, check_hooks, drafter_modules, hook
from dspark.stats import GenerationResult
from dspark.strategy import Strategy, check_max_draft_tokens
from dspark.types import SamplingConfig
from dspark.validation import (
    check_drafter,
    check_forward_signature,
    check_generation_config,
    check_generator,
    check_max_new_tokens,
    check_prompt,
    check_row_values,
    context_length,
    eos_ids,
)
from dspark.verify.policies import FixedLength

__all__ = ["SpeculativeModel", "wrap", "generate", "profiled_cost_model", "DEFAULT_DRAFT_TOKENS", "PROFILED_ROWS"]

#: Block width γ when neither the policy nor the caller fixes one.
DEFAULT_DRAFT_TOKENS = 4
# Batch sizes a cost model made by wrap profiles at once; a larger batch adds powers of two up to its size.
PROFILED_ROWS = BASE_ROWS


def _resolve_fast_path(model: torch.nn.Module, drafter, fast_path) -> FastPath | None:
    """None/True/False/a FastPath -> the FastPath dspark's forwards run under (None: plain forwards)."""
    if fast_path is not None and not isinstance(fast_path, (bool, FastPath)):
        raise TypeError(f"fast_path must be None (on for CPU targets), a bool or a dspark.fast_path.FastPath, got {type(fast_path).__name__}")
    if fast_path is None:
        # Accelerators already pick good kernels for few-row products; the gain is a CPU BLAS matter.
        fast_path = on_cpu(model)
    if fast_path is False:
        return None
    if fast_path is True:
        fast_path = FastPath.shared(model)  # every wrap of this model shares its measurements and copies
    for module in drafter_modules(drafter):
        fast_path.include(module)
        # Whether its one-row products read its copies, timed on one-row drafting passes as the loop runs them.
        fast_path.measure_one_row(module, forward=functools.partial(
            one_row_draft_seconds, model, drafter, fast_path, hook(drafter, "max_draft_tokens", DRAFTER_HOOKS) or DEFAULT_DRAFT_TOKENS
        ))
    return fast_path


class SpeculativeModel:
    """A target model with a speculative decoding strategy; ``generate`` is lossless for any strategy.

    ``fast_path`` runs dspark's own target and drafter forwards on a ``dspark.fast_path.FastPath``:
    None (default) turns it on for targets on the CPU (``FastPath.shared(model)``, one per model),
    True or False force it, and a ``FastPath`` instance is used as given; the drafter's modules are
    included in it. ``model.generate`` and any other use of the model are untouched.
    """

    def __init__(self, model: torch.nn.Module, strategy: Strategy, fast_path: bool | FastPath | None = None):
        if not isinstance(strategy, Strategy):
            raise TypeError(f"strategy must be a dspark.Strategy, got {type(strategy).__name__}")
        self.model = model
        self.strategy = strategy
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.forward_arguments = check_forward_signature(model)
        check_drafter(strategy.drafter, self.vocab_size)
        self.fast_path = _resolve_fast_path(model, strategy.drafter, fast_path)

    def __repr__(self) -> str:
        return f"SpeculativeModel({type(self.model).__name__}, {self.strategy!r})"

    @torch.inference_mode()
    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        max_new_tokens: int = 128,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | list[int] | None = None,
        generator: torch.Generator | None = None,
        streamer=None,
        pad_token_id: int | None = None,
        max_draft_tokens_per_row=None,
        priority=None,
        prefill_chunk_tokens: int = PREFILL_CHUNK_TOKENS,
    ) -> GenerationResult:
        """Generate like ``model.generate``: greedy output equals the target's greedy output token for token,
        sampled output follows the target's warped distribution exactly.

        ``eos_token_id`` and ``pad_token_id`` default to the model's generation config (pass ``[]`` for no EOS).
        Sampling settings are exactly the arguments given: unlike HF ``generate``, the generation config's
        temperature/top-k/top-p defaults are not applied (``top_k=None`` means no top-k). Generation-config
        settings that would change the decoded tokens (repetition penalty, banned words, …) are refused.
        ``generator`` makes sampling reproducible. ``streamer`` (any transformers streamer) needs batch size 1.

        Per request (one value per row of ``input_ids``): ``max_draft_tokens_per_row`` caps how many draft
        tokens of that row the target verifies in a step (0: the row is never drafted for, plain decoding);
        ``priority`` weights the row's tokens (w_r > 0) in policies that read it, such as the
        hardware-aware scheduler, which then spends verification on high-priority rows first. Neither
        changes any row's output.

        ``prefill_chunk_tokens``: the prompt is read in forwards of at most about this many tokens (rows ×
        columns; at least one column each), which bounds the memory of the hidden states a drafter reads and
        saves attention work on long batched prompts.
        """
        input_ids, attention_mask = check_prompt(input_ids, attention_mask, self.vocab_size)
        rows = input_ids.shape[0]
        draft_caps = check_row_values("max_draft_tokens_per_row", max_draft_tokens_per_row, rows, input_ids.device, integer=True)
        priority = check_row_values("priority", priority, rows, input_ids.device, integer=False)
        max_new_tokens = check_max_new_tokens(max_new_tokens)
        prefill_chunk_tokens = check_int("prefill_chunk_tokens", prefill_chunk_tokens, 1)
        sampling = SamplingConfig(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p)
        check_generator(generator, input_ids.device)
        if streamer is not None and input_ids.shape[0] != 1:
            raise ValueError(f"streamer needs batch size 1, got input_ids of batch size {input_ids.shape[0]}")
        prompt_length = input_ids.shape[1]
        limit = context_length(self.model.config)
        max_slots = prompt_length + max_new_tokens + 2 * (self.strategy.max_draft_tokens + 1)
        if limit is not None and prompt_length > limit:
            raise ValueError(f"input_ids has length {prompt_length}, longer than the model's context of {limit} tokens")
        if limit is not None and prompt_length + max_new_tokens > limit:
            raise ValueError(
                f"max_new_tokens={max_new_tokens} with a prompt of {prompt_length} tokens exceeds the model's context "
                f"of {limit} tokens; allowed: max_new_tokens <= {limit - prompt_length}"
            )
        check_cache_support(self.model.config, max_slots)
        config = self.model.generation_config
        check_generation_config(config)
        eos = eos_ids(config.eos_token_id if eos_token_id is None else eos_token_id, self.vocab_size)
        if pad_token_id is None:
            pad_token_id = config.pad_token_id if config.pad_token_id is not None else (eos[0] if eos else 0)
        spec = LoopSpec(
            target=self.model,
            strategy=self.strategy,
            forward_arguments=self.forward_arguments,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            eos_token_ids=tuple(eos),
            pad_token_id=int(pad_token_id),
            generator=generator,
            streamer=streamer,
            fast_path=self.fast_path,
            draft_caps=draft_caps,
            priority=priority,
            prefill_chunk_tokens=prefill_chunk_tokens,
        )
        return run_generation(spec, input_ids, attention_mask)


def profiled_cost_model(model: torch.nn.Module, drafter: Drafter, max_draft_tokens: int, fast_path=None) -> CostModel:
    """What a target forward and a drafting pass cost here, at each generation's shape, corrected by every
    step's measured times (``OnlineCorrectedCostModel``). The shape is measured once per machine, model
    and drafter (``AutoProfiledCostModel``: 1 to γ + 1 tokens over ``PROFILED_ROWS`` at a 256-token
    context at once; more rows and longer contexts the first time a generation needs them; all cached)."""
    from dspark.cost_models import AutoProfiledCostModel, OnlineCorrectedCostModel

    table = AutoProfiledCostModel(
        model, drafter, tokens=tuple(range(1, max_draft_tokens + 2)), base_rows=PROFILED_ROWS,
        fast_path=fast_path, max_draft_tokens=max(max_draft_tokens, 1),
    )
    return OnlineCorrectedCostModel(table)


def wrap(
    model: torch.nn.Module,
    drafter: Drafter,
    *,
    policy: VerifyPolicy | None = None,
    confidence: ConfidenceEstimator | None = None,
    cost_model: CostModel | None = None,
    max_draft_tokens: int | None = None,
    fast_path: bool | FastPath | None = None,
) -> SpeculativeModel:
    """Compose ``drafter`` with a policy, an optional confidence estimator and a cost model around ``model``.

    With no ``policy``, the drafter's own ``default_policy`` (and ``default_confidence``, unless
    ``confidence`` is given) is used when it declares one, else every drafted token is verified.
    γ defaults to the policy's ``max_draft_tokens`` when it has one, else to the drafter's
    ``max_draft_tokens``, else ``DEFAULT_DRAFT_TOKENS``. ``fast_path`` is ``SpeculativeModel``'s
    (default: on for CPU targets; ``fast_path=False`` runs plain forwards). A policy that reads the
    cost model (``needs_cost_model``) and gets none is given ``profiled_cost_model``: measured on
    this machine on first use, cached, corrected online."""
    check_hooks(drafter, DRAFTER_HOOKS, "drafter")
    if policy is not None:
        check_hooks(policy, POLICY_HOOKS, "policy")
    if policy is None and hook(drafter, "default_policy", DRAFTER_HOOKS) is not None:
        policy = drafter.default_policy
        confidence = hook(drafter, "default_confidence", DRAFTER_HOOKS) if confidence is None else confidence
    if max_draft_tokens is None and policy is not None:
        max_draft_tokens = hook(policy, "max_draft_tokens", POLICY_HOOKS)
    if max_draft_tokens is None:
        max_draft_tokens = hook(drafter, "max_draft_tokens", DRAFTER_HOOKS) or DEFAULT_DRAFT_TOKENS
    max_draft_tokens = check_max_draft_tokens(max_draft_tokens)
    strategy_arguments = {
        "drafter": drafter,
        "policy": FixedLength(max_draft_tokens) if policy is None else policy,
        "max_draft_tokens": max_draft_tokens,
        "confidence": confidence,
    }
    if cost_model is None and hook(strategy_arguments["policy"], "needs_cost_model", POLICY_HOOKS):
        cost_model = profiled_cost_model(model, drafter, max_draft_tokens, fast_path)
    if cost_model is not None:
        strategy_arguments["cost_model"] = cost_model
    strategy = Strategy(**strategy_arguments)
    return SpeculativeModel(model, strategy, fast_path=fast_path)


def generate(model: torch.nn.Module, input_ids: torch.Tensor, *, drafter: Drafter, attention_mask=None, **kwargs) -> GenerationResult:
    """One-call form of ``wrap(model, drafter).generate(input_ids, ...)``; wrap options (policy, confidence,
    cost_model, max_draft_tokens, fast_path) and generate options are both accepted as keywords."""
    wrap_keys = ("policy", "confidence", "cost_model", "max_draft_tokens", "fast_path")
    wrap_arguments = {key: kwargs.pop(key) for key in wrap_keys if key in kwargs}
    return wrap(model, drafter, **wrap_arguments).generate(input_ids, attention_mask=attention_mask, **kwargs)
