"""Acceptance and speed of semi-autoregressive drafters on SmolLM2 (paper §4, Figure 2).

For every drafter given as NAME=PATH (a ``SemiARDrafter.save_pretrained`` directory) — or, with
``--untrained``, freshly initialised Markov / RNN / parallel-only / autoregressive-head drafters as a
smoke test of the script — on Spec-Bench (every category), HumanEval and GSM8K test prompts, batch 1,
γ verified in full (``FixedLength(γ)``):

* τ and the conditional acceptance per draft position, P(k accepted | 1..k−1 accepted), greedy and
  at temperature 1, plotted like the paper's Figure 2;
* greedy tokens/s against HF ``generate``, HF prompt lookup and dspark's own ``PromptLookupDrafter``
  on the same prompts (outputs checked token for token), and drafting time per step next to
  verification time and to one plain one-token target step (``FixedLength(0)``), the ratio the
  drafting budget is stated in;
* each drafter's τ over the parallel-only drafter's (when one is given) and its mean conditional
  acceptance past position 1 — the suffix-decay comparison;
* for a drafter whose config names a measured default verify rule, the speed of
  ``wrap(target, drafter)`` with that rule (``NAME_default``); the cost tables such a rule reads are
  profiled for every prompt's shape before anything is timed.

    python benchmarks/bench_drafters.py --drafter shipped=dspark/pretrained_drafters/smollm2-135m-instruct
    python benchmarks/bench_drafters.py --untrained --quick
"""

from __future__ import annotations

import argparse
import collections
import shlex
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers.utils import logging as transformers_logging

import dspark
from dspark import pretrained
from dspark.benchmarking import generated_tokens, write_json
from dspark.cost_models import AutoProfiledCostModel
from dspark.drafters import CascadeDrafter, PromptLookupDrafter, SemiARConfig, SemiARDrafter, TargetSignature, default_target_layers
from dspark.training.data import eval_prompts
from dspark.pretrained import encode_chat
from dspark.types import GenerationStart, SamplingConfig
from dspark.verify import CalibrationFile, FixedLength, calibrated_estimator

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CHAT_CATEGORIES = ("writing", "roleplay", "reasoning", "stem", "humanities", "qa")
UNTRAINED = {"markov": ("markov", "parallel"), "rnn": ("rnn", "parallel"), "parallel_only": (None, "parallel"), "autoregressive_head": (None, "autoregressive")}


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", action="append", default=[], help="NAME=PATH of a saved SemiARDrafter (repeatable)")
    parser.add_argument("--untrained", action="store_true", help="benchmark untrained drafters of every variant (smoke test)")
    parser.add_argument("--data-dir", default=None, help="the prompt-data folder holding eval/ (default: dspark.training.default_data_dir())")
    parser.add_argument("--spec-per-category", type=int, default=5)
    parser.add_argument("--humaneval", type=int, default=20)
    parser.add_argument("--gsm8k", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--gamma", type=int, default=7)
    parser.add_argument("--modes", default="greedy,sample")
    parser.add_argument("--quick", action="store_true", help="1 prompt per category, 2 HumanEval, 2 GSM8K, 32 tokens")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--cascade", type=Path, default=None, metavar="LOOKUP_CALIBRATION_DIR",
                        help="also time CascadeDrafter(prompt lookup, each calibrated drafter) with wrap's defaults, lookup scored by this calibration")
    args = parser.parse_args(argv)
    if args.quick:
        args.spec_per_category, args.humaneval, args.gsm8k, args.max_new_tokens = 1, 2, 2, 32
    if not args.drafter and not args.untrained:
        parser.error("give --drafter NAME=PATH (repeatable) or --untrained")
    args.output = args.output or RESULTS / ("bench_drafters_quick.json" if args.quick else "bench_drafters.json")
    return args


def _drafters(args, target) -> dict:
    drafters = {}
    for spec in args.drafter:
        name, _, path = spec.partition("=")
        drafters[name] = SemiARDrafter.from_pretrained(path, target=target)
    if args.untrained:
        for name, (sequential, backbone) in UNTRAINED.items():
            config = SemiARConfig(
                target=TargetSignature.of(target), target_layers=default_target_layers(target.config.num_hidden_layers),
                max_draft_tokens=args.gamma, num_heads=target.config.num_attention_heads, sequential=sequential, backbone=backbone,
            )
            torch.manual_seed(0)
            drafters[name] = SemiARDrafter(config, target).eval()
    return drafters


class _Acceptance:
    """Running counts of verified, reached and accepted draft tokens per position, and step times."""

    def __init__(self, gamma: int):
        self.reached, self.accepted = torch.zeros(gamma), torch.zeros(gamma)
        self.tokens = self.row_steps = 0
        self.draft_seconds = self.verify_seconds = 0.0

    def add(self, stats) -> None:
        reached, accepted = stats.position_counts()
        self.reached += reached
        self.accepted += accepted
        self.tokens += stats.new_tokens
        self.row_steps += sum(record.rows.numel() for record in stats.records)
        self.draft_seconds += stats.draft_seconds
        self.verify_seconds += stats.verify_seconds

    def summary(self) -> dict:
        rates = (self.accepted / self.reached.clamp_min(1)).tolist()
        return {
            "tau": self.tokens / max(self.row_steps, 1),
            "position_acceptance": rates,
            # Blocks that reached each position: late rates rest on few blocks when early acceptance is low.
            "position_reached": [int(count) for count in self.reached.tolist()],
            "draft_ms_per_step": 1000 * self.draft_seconds / max(self.row_steps, 1),
            "verify_ms_per_step": 1000 * self.verify_seconds / max(self.row_steps, 1),
            "draft_over_verify": self.draft_seconds / max(self.verify_seconds, 1e-12),
        }


def _category_summary(summary: dict) -> dict:
    """τ and first-position acceptance of one category's counts, and how many blocks they rest on."""
    return {"tau": summary["tau"], "first_position": summary["position_acceptance"][0], "blocks": summary["position_reached"][0]}


def _versus_parallel_only(drafters: dict, summaries: dict) -> dict:
    """Per drafter: τ over the parallel-only drafter's τ, and mean conditional acceptance at positions 2..γ.

    The issue's ablation claims (paper Figure 2): the semi-AR Markov drafter reaches ≥ 1.15× the τ of
    the parallel-only drafter, and its conditional acceptance decays less past position 1. The ratio
    is given only when exactly one parallel-only drafter (``sequential=None``, parallel backbone) runs.
    """
    parallel_only = [name for name, drafter in drafters.items() if drafter.config.sequential is None and drafter.config.backbone == "parallel"]
    comparison = {}
    for name, summary in summaries.items():
        rates = summary["position_acceptance"]
        comparison[name] = {"mean_conditional_acceptance_after_first": sum(rates[1:]) / max(len(rates) - 1, 1)}
        if len(parallel_only) == 1:
            comparison[name]["tau_vs_parallel_only"] = summary["tau"] / summaries[parallel_only[0]]["tau"]
    return comparison


def _profile_shapes(models, tokenizer, prompts, max_new_tokens: int) -> None:
    """Profile, before anything is timed, every cost table the models' profiled cost models will read: one
    per shape (rows grid, context band) the prompts give. A deployment profiles once at start (paper §3.2.2);
    a table first needed inside a timed call would charge its profiling to one prompt's speed."""
    lengths = {encode_chat(tokenizer, [prompt.message])["input_ids"].shape[1] for prompt in prompts}
    for model in models:
        auto = getattr(model.strategy.cost_model, "base", None)
        if not isinstance(auto, AutoProfiledCostModel):
            continue
        shapes = {
            auto.shape(GenerationStart(rows=1, device=torch.device("cpu"), max_draft_tokens=model.strategy.max_draft_tokens,
                                       max_length=length + max_new_tokens, sampling=SamplingConfig(), prompt_length=length))
            for length in lengths
        }
        for shape in sorted(shapes):
            auto.profiled(shape)


def _timed(function):
    started = time.perf_counter()
    output = function()
    return output, time.perf_counter() - started


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    modes = list(report["acceptance"])
    figure, axes = pyplot.subplots(1, len(modes), figsize=(5 * len(modes), 4), squeeze=False)
    for axis, mode in zip(axes[0], modes):
        for name, summary in report["acceptance"][mode].items():
            rates = summary["position_acceptance"]
            axis.plot(range(1, len(rates) + 1), rates, marker="o", label=f"{name} (τ {summary['tau']:.2f})")
        axis.set(title=f"{mode}: P(k accepted | 1..k−1 accepted)", xlabel="draft position k", ylabel="conditional acceptance", ylim=(0, 1))
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict:
    args = _parse_args(argv)
    transformers_logging.disable_progress_bar()
    bundle = pretrained.load()
    bundle.tokenizer.padding_side = "left"
    target, eos = bundle.target, bundle.target.generation_config.eos_token_id
    drafters, prompts = _drafters(args, target), eval_prompts(args.data_dir, args.spec_per_category, args.humaneval, args.gsm8k)
    modes = [mode for mode in args.modes.split(",") if mode]
    acceptance = {mode: {name: _Acceptance(args.gamma) for name in drafters} for mode in modes}
    # The same counts per prompt category: where a drafter's text transfers and where it does not.
    by_category = {mode: {name: collections.defaultdict(lambda: _Acceptance(args.gamma)) for name in drafters} for mode in modes}
    speed = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0.0]))  # category -> method -> [tokens, s]

    def record_speed(category, method, tokens, seconds):
        speed[category][method][0] += len(tokens)
        speed[category][method][1] += seconds

    mismatches, defaults = [], collections.defaultdict(lambda: _Acceptance(args.gamma))
    lookup_acceptance = _Acceptance(PromptLookupDrafter().max_draft_tokens)
    # Built once, outside every timed call: what a caller keeps between generations.
    lookup = dspark.wrap(target, PromptLookupDrafter())
    plain = dspark.wrap(target, PromptLookupDrafter(), policy=FixedLength(0))
    default_models = {name: dspark.wrap(target, drafter) for name, drafter in drafters.items()}
    if args.cascade is not None:
        lookup_confidence = calibrated_estimator(CalibrationFile.load(args.cascade))
        for name, drafter in drafters.items():
            if drafter.calibration is not None:
                cascade = CascadeDrafter([(PromptLookupDrafter(), lookup_confidence), (drafter, calibrated_estimator(drafter.calibration))])
                default_models[f"cascade_{name}"] = dspark.wrap(target, cascade)
    plain_seconds, plain_steps = 0.0, 0
    _profile_shapes(default_models.values(), bundle.tokenizer, prompts, args.max_new_tokens)
    # One short untimed call of each method, so the first timed prompt does not pay one-off set-up alone.
    warm_up = encode_chat(bundle.tokenizer, [prompts[0].message])
    target.generate(**warm_up, max_new_tokens=2, do_sample=False)
    for drafter in [PromptLookupDrafter(), *drafters.values()]:
        dspark.wrap(target, drafter).generate(**warm_up, max_new_tokens=2)
    for name, model in default_models.items():
        if name.startswith("cascade_"):
            model.generate(**warm_up, max_new_tokens=2)
    for index, prompt in enumerate(tqdm(prompts, desc="prompts", unit="prompt")):
        encoded = encode_chat(bundle.tokenizer, [prompt.message])
        length = encoded["input_ids"].shape[1]
        sequences, seconds = _timed(lambda: target.generate(**encoded, max_new_tokens=args.max_new_tokens, do_sample=False))
        reference = generated_tokens(sequences, length, eos)[0]
        record_speed(prompt.category, "hf_generate", reference, seconds)
        sequences, seconds = _timed(lambda: target.generate(**encoded, max_new_tokens=args.max_new_tokens, do_sample=False, prompt_lookup_num_tokens=10))
        record_speed(prompt.category, "hf_prompt_lookup", generated_tokens(sequences, length, eos)[0], seconds)
        result, seconds = _timed(lambda: lookup.generate(**encoded, max_new_tokens=args.max_new_tokens))
        record_speed(prompt.category, "dspark_prompt_lookup", generated_tokens(result.sequences, length, eos)[0], seconds)
        if generated_tokens(result.sequences, length, eos)[0] != reference:
            mismatches.append({"prompt": index, "drafter": "dspark_prompt_lookup"})
        lookup_acceptance.add(result.stats)
        # Plain decoding through the same loop (on the fast path): its speed against HF generate, and the
        # one-token target step that drafting is measured against.
        result, seconds = _timed(lambda: plain.generate(**encoded, max_new_tokens=args.max_new_tokens))
        record_speed(prompt.category, "dspark_autoregressive", generated_tokens(result.sequences, length, eos)[0], seconds)
        plain_seconds += result.stats.verify_seconds
        plain_steps += result.stats.steps
        for name, drafter in drafters.items():
            model = dspark.wrap(target, drafter, policy=FixedLength(args.gamma))
            for mode in modes:
                sampling = {"do_sample": True, "generator": torch.Generator().manual_seed(index)} if mode == "sample" else {}
                result, seconds = _timed(lambda: model.generate(**encoded, max_new_tokens=args.max_new_tokens, **sampling))
                acceptance[mode][name].add(result.stats)
                by_category[mode][name][prompt.category].add(result.stats)
                if mode == "greedy":
                    tokens = generated_tokens(result.sequences, length, eos)[0]
                    record_speed(prompt.category, name, tokens, seconds)
                    if tokens != reference:
                        mismatches.append({"prompt": index, "drafter": name})
            if drafter.default_policy != FixedLength(args.gamma):
                # The drafter's measured default verify rule (what wrap(target, drafter) gives), greedy only.
                result, seconds = _timed(lambda: default_models[name].generate(**encoded, max_new_tokens=args.max_new_tokens))
                tokens = generated_tokens(result.sequences, length, eos)[0]
                record_speed(prompt.category, f"{name}_default", tokens, seconds)
                defaults[name].add(result.stats)
                if tokens != reference:
                    mismatches.append({"prompt": index, "drafter": f"{name}_default"})
        for name, model in default_models.items():
            if name.startswith("cascade_"):
                result, seconds = _timed(lambda: model.generate(**encoded, max_new_tokens=args.max_new_tokens))
                tokens = generated_tokens(result.sequences, length, eos)[0]
                record_speed(prompt.category, name, tokens, seconds)
                defaults[name].add(result.stats)
                if tokens != reference:
                    mismatches.append({"prompt": index, "drafter": name})
    methods = ["hf_generate", "hf_prompt_lookup", "dspark_autoregressive", "dspark_prompt_lookup", *drafters, *(name if name.startswith("cascade_") else f"{name}_default" for name in defaults)]
    tokens_per_s = {
        category: {method: counts[method][0] / counts[method][1] for method in methods if counts[method][1]} for category, counts in speed.items()
    }
    def pooled(categories):
        return {method: sum(speed[c][method][0] for c in categories) / sum(speed[c][method][1] for c in categories) for method in methods}

    overall = pooled(list(speed))
    chat = pooled([category for category in CHAT_CATEGORIES if category in speed]) if any(c in speed for c in CHAT_CATEGORIES) else {}
    one_token_ms = 1000 * plain_seconds / max(plain_steps, 1)
    summaries = {mode: {name: counter.summary() for name, counter in by_name.items()} for mode, by_name in acceptance.items()}
    report = {
        "command": shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(["bench_drafters.py", *argv]),
        "settings": {"gamma": args.gamma, "max_new_tokens": args.max_new_tokens, "prompts": len(prompts), "drafters": list(drafters), "modes": modes},
        "acceptance": summaries,
        "acceptance_by_category": {
            mode: {
                name: {category: _category_summary(counter.summary()) for category, counter in counters.items()}
                for name, counters in by_name.items()
            }
            for mode, by_name in by_category.items()
        },
        "versus_parallel_only": {mode: _versus_parallel_only(drafters, summaries[mode]) for mode in modes},
        "one_token_step_ms": one_token_ms,
        # Drafting time per step (first mode) over one plain target step: the "at most 25%" budget.
        "draft_cost_vs_one_token_step": {name: summaries[modes[0]][name]["draft_ms_per_step"] / one_token_ms for name in drafters},
        "default_policy": {
            name: {"policy": repr(default_models[name].strategy.policy), **counter.summary()}
            for name, counter in defaults.items()
        },
        "dspark_prompt_lookup": lookup_acceptance.summary(),
        "greedy_tokens_per_s": {"overall": overall, "categories": tokens_per_s},
        "speedup_vs_hf_generate": {method: overall[method] / overall["hf_generate"] for method in methods},
        "chat_speedup_vs_hf_prompt_lookup": {method: chat[method] / chat["hf_prompt_lookup"] for method in chat},
        "greedy_mismatches": mismatches,
    }
    write_json(args.output, report)
    _plot(report, args.output.with_suffix(".png"))
    for mode in modes:
        for name, summary in report["acceptance"][mode].items():
            rates = " ".join(f"{rate:.2f}" for rate in summary["position_acceptance"])
            versus = report["versus_parallel_only"][mode][name]
            ratio = f"  τ / parallel-only {versus['tau_vs_parallel_only']:.2f}" if "tau_vs_parallel_only" in versus else ""
            print(f"{mode:7s} {name:20s} τ {summary['tau']:.2f}{ratio}  per position {rates}  draft {summary['draft_ms_per_step']:.1f} ms / verify {summary['verify_ms_per_step']:.1f} ms")
    print(f"one-token target step {one_token_ms:.1f} ms; drafting / one-token step:", {name: round(value, 2) for name, value in report["draft_cost_vs_one_token_step"].items()})
    print("greedy speedup vs HF generate:", {method: round(value, 2) for method, value in report["speedup_vs_hf_generate"].items()})
    print("chat categories, speed vs HF prompt lookup:", {method: round(value, 2) for method, value in report["chat_speedup_vs_hf_prompt_lookup"].items()})
    print(f"greedy mismatches: {len(mismatches)}; wrote {args.output} and {args.output.with_suffix('.png')}")
    return report


if __name__ == "__main__":
    main()
