"""What a SmolLM2 target forward costs on this machine, default path against dspark's fast path.

Grid: rows × new tokens per row × context length; every point is timed on both paths back to back
(``dspark.cost_models.profiling.measure_step_time``, median of ``--repeats`` after a warm-up), so
drift in machine load hits both alike. The report gives, per path, the ratio of each point to the
one-token step of the same rows and context (the cost of checking drafts), the fast path's speed-up
over the default path, HF ``generate``'s own per-token step at the first context for comparison,
the largest logit difference between the two paths on a real prompt, and the fast path's chosen
formulation per weight shape and row count.

    python benchmarks/bench_cost_curve.py            # the full grid (about 10 minutes on 2 cores)
    python benchmarks/bench_cost_curve.py --quick    # rows 1, 4; tokens 1, 4, 8; context 300
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

import attrs
import torch
import transformers
from tqdm import tqdm
from transformers.utils import logging as transformers_logging

from dspark import pretrained
from dspark.benchmarking import write_json
from dspark.cost_models.profiling import measure_step_time
from dspark.fast_path import FastPath

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
PATHS = ("default", "fast")


def _ints(text: str) -> list[int]:
    return [int(value) for value in text.split(",") if value.strip()]


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=_ints, default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--tokens", type=_ints, default=[1, 2, 4, 8, 16])
    parser.add_argument("--contexts", type=_ints, default=[300, 1000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="rows 1,4; tokens 1,4,8; context 300")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.tokens, args.contexts = [1, 4], [1, 4, 8], [300]
    if 1 not in args.tokens:
        parser.error("--tokens must include 1: every point is reported against the one-token step")
    args.output = args.output or RESULTS / ("bench_cost_curve_quick.json" if args.quick else "bench_cost_curve.json")
    return args


def _hf_generate_step(model, context: int, new_tokens: int = 32) -> float:
    """Seconds per token of HF ``generate`` after ``context`` prompt tokens (generation minus its prefill)."""
    prompt = torch.randint(100, model.config.vocab_size, (1, context), generator=torch.Generator().manual_seed(0))

    def timed(tokens):
        started = time.perf_counter()
        # min_new_tokens keeps an early EOS from shortening the run.
        model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        return time.perf_counter() - started

    timed(2)
    return min((timed(new_tokens + 1) - timed(1)) / new_tokens for _ in range(2))


def _max_logit_difference(model, fast_path: FastPath, tokenizer) -> float:
    """Largest |logit| difference between the default and the fast path over a real chat prompt's forward."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Explain how a hash map works, with an example in Python."}], add_generation_prompt=True, tokenize=False)
    input_ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        reference = model(input_ids=input_ids).logits
        with fast_path.active():
            fast = model(input_ids=input_ids).logits
    return float((fast - reference).abs().max())


def _ratios(points: dict, path: str) -> dict:
    """Per context and rows: each token count's step time over the one-token step's."""
    ratios = {}
    for (context, rows, tokens), timing in points.items():
        one = points[(context, rows, 1)][path]
        ratios.setdefault(str(context), {}).setdefault(str(rows), {})[str(tokens)] = timing[path] / one
    return ratios


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    contexts = report["settings"]["contexts"]
    figure, axes = pyplot.subplots(1, len(contexts), figsize=(6 * len(contexts), 4.5), squeeze=False)
    colors = pyplot.rcParams["axes.prop_cycle"].by_key()["color"]
    for axis, context in zip(axes[0], contexts):
        for index, rows in enumerate(report["settings"]["rows"]):
            for forward_path, style in (("default", "--"), ("fast", "-")):
                points = [p for p in report["points"] if p["context"] == context and p["rows"] == rows]
                axis.plot([p["tokens"] for p in points], [1000 * p[f"{forward_path}_seconds"] for p in points], style, marker="o",
                          color=colors[index % len(colors)], label=f"{rows} rows, {forward_path}")
        axis.set(title=f"context {context}: one target forward", xlabel="new tokens per row", ylabel="ms", xscale="log", yscale="log")
        axis.set_xticks(report["settings"]["tokens"], [str(t) for t in report["settings"]["tokens"]])
        axis.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict:
    args = _parse_args(argv)
    load_before = os.getloadavg()
    transformers_logging.disable_progress_bar()
    model, tokenizer = pretrained.load_target()
    fast_path = FastPath.for_model(model)
    grid = [(context, rows, tokens) for context in args.contexts for rows in args.rows for tokens in args.tokens]
    points = {}
    for context, rows, tokens in tqdm(grid, desc="cost curve", unit="point"):
        timings = {
            path: measure_step_time(model, rows, tokens, context, fast_path if path == "fast" else None, repeats=args.repeats).seconds
            for path in PATHS
        }
        points[(context, rows, tokens)] = timings
    hf_step = _hf_generate_step(model, args.contexts[0])
    report = {
        "command": shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(["bench_cost_curve.py", *argv]),
        "settings": {
            "model": "smollm2-135m-instruct", "dtype": str(next(model.parameters()).dtype).removeprefix("torch."), "rows": args.rows, "tokens": args.tokens, "contexts": args.contexts,
            "repeats": args.repeats, "torch": torch.__version__, "transformers": transformers.__version__,
            "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
        },
        "points": [
            {"context": c, "rows": r, "tokens": t, "default_seconds": v["default"], "fast_seconds": v["fast"], "fast_speedup": v["default"] / v["fast"]}
            for (c, r, t), v in points.items()
        ],
        "ratio_vs_one_token_step": {path: _ratios(points, path) for path in PATHS},
        "hf_generate_step_seconds": {"context": args.contexts[0], "seconds": hf_step},
        "fast_one_token_step_vs_hf_generate_step": points[(args.contexts[0], 1, 1)]["fast"] / hf_step if 1 in args.rows else None,
        "max_logit_difference_fast_vs_default": _max_logit_difference(model, fast_path, tokenizer),
        "fast_path": {
            "copy_budget_bytes": fast_path.copy_budget, "copy_bytes": fast_path.copy_bytes, "reserved_bytes": fast_path.reserved_bytes,
            "model_parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            "choices": [attrs.asdict(choice) for choice in fast_path.choices()],
        },
    }
    report["settings"]["load_average_1_5_15min"] = {"start": load_before, "end": os.getloadavg()}
    write_json(args.output, report)
    _plot(report, args.output.with_suffix(".png"))
    print(fast_path.describe())
    for path in PATHS:
        print(f"\n{path} path, ms per forward (ratio to the one-token step of the same rows):")
        for context in args.contexts:
            for rows in args.rows:
                cells = "  ".join(
                    f"{t}: {1000 * points[(context, rows, t)][path]:6.1f} ({report['ratio_vs_one_token_step'][path][str(context)][str(rows)][str(t)]:.2f}x)"
                    for t in args.tokens
                )
                print(f"  context {context:5d}, rows {rows:3d} | {cells}")
    print(f"\nHF generate step at context {args.contexts[0]}: {1000 * hf_step:.1f} ms; fast one-token step / HF step: {report['fast_one_token_step_vs_hf_generate_step']}")
    print(f"largest logit difference, fast vs default path: {report['max_logit_difference_fast_vs_default']:.3g}")
    print(f"wrote {args.output} and {args.output.with_suffix('.png')}")
    return report


if __name__ == "__main__":
    main()
