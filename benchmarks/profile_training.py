"""Training throughput of a SemiARDrafter on this machine: sequences/s per precision, and where a step's time goes.

A drafter of the given shape (the shipped SmolLM2 drafter's by default) trains for ``--steps`` steps
on ``--sequences`` synthetic stored sequences of ``--length`` tokens (random features and labels:
the arithmetic is that of real data of that length) after ``--warmup`` untimed steps, once per
precision, on ``--threads`` threads. The JSON gives sequences/s per precision, the speed-up over
float32, and the ``cProfile`` entries that take the most time of the step, which tell the model's
arithmetic (``linear``, ``run_backward``, attention) from everything else.

    python benchmarks/profile_training.py --precisions float32,bfloat16 --threads 1
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dspark import pretrained  # noqa: E402
from dspark.benchmarking import write_json  # noqa: E402
from dspark.drafters import SemiARConfig, SemiARDrafter  # noqa: E402
from dspark.training.store import TargetSequence  # noqa: E402
from dspark.training.trainer import PRECISIONS, TrainConfig, train  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precisions", default="float32,bfloat16", help=f"comma-separated, among {tuple(PRECISIONS)}")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--length", type=int, default=400, help="tokens per synthetic sequence")
    parser.add_argument("--prompt-length", type=int, default=60)
    parser.add_argument("--sequences-per-step", type=int, default=8)
    parser.add_argument("--anchors-per-sequence", type=int, default=16)
    parser.add_argument("--anchor-input", default="feature", choices=["embedding", "feature"])
    parser.add_argument("--draft-vocab-size", type=int, default=8192)
    parser.add_argument("--output", type=Path, default=RESULTS / "profile_training.json")
    args = parser.parse_args(argv)
    args.precisions = [name for name in args.precisions.split(",") if name]
    unknown = [name for name in args.precisions if name not in PRECISIONS]
    if unknown:
        parser.error(f"--precisions must be among {tuple(PRECISIONS)}, got {unknown}")
    return args


def synthetic_store(count: int, length: int, prompt_length: int, feature_width: int, vocab_size: int, draft_vocab_size: int) -> list[TargetSequence]:
    """``count`` stored sequences of random tokens, features and top-32 labels, seeded."""
    generator = torch.Generator().manual_seed(0)
    labelled = length - prompt_length + 1
    return [
        TargetSequence(
            torch.randint(0, draft_vocab_size, (length,), generator=generator), prompt_length,
            torch.randn(length, feature_width, generator=generator).half(),
            torch.randint(0, vocab_size, (labelled, 32), generator=generator).int(),
            torch.rand(labelled, 32, generator=generator).softmax(dim=-1),
        )
        for _ in range(count)
    ]


def _config(args, steps: int, precision: str) -> TrainConfig:
    return TrainConfig(
        steps=steps, sequences_per_step=args.sequences_per_step, anchors_per_sequence=args.anchors_per_sequence, precision=precision,
        log_every_seconds=float("inf"), checkpoint_every=10**9, validate_every=10**9,
    )


def _profile(args, target, store, precision: str) -> dict:
    """Sequences/s of ``args.steps`` timed steps in ``precision``, and the step's top cProfile entries."""
    config = SemiARConfig.for_target(target, draft_vocab_size=args.draft_vocab_size, anchor_input=args.anchor_input)
    torch.manual_seed(0)
    drafter = SemiARDrafter(config, target, draft_vocab=torch.arange(args.draft_vocab_size))
    train(drafter, store, _config(args, args.warmup, precision), log=lambda line: None)
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    train(drafter, store, _config(args, args.steps, precision), log=lambda line: None)
    profiler.disable()
    seconds = time.perf_counter() - started
    stats = pstats.Stats(profiler).stats
    top = sorted(stats.items(), key=lambda item: item[1][2], reverse=True)[:12]
    return {
        "sequences_per_second": args.steps * args.sequences_per_step / seconds,
        "seconds_per_step": seconds / args.steps,
        "top_by_own_time": [
            {"function": f"{Path(file).name}:{line}({name})", "calls": entry[1], "own_seconds_per_step": entry[2] / args.steps}
            for (file, line, name), entry in top
        ],
    }


def main(argv: list[str] | None = None) -> dict:
    args = _parse_args(argv)
    torch.set_num_threads(args.threads)
    target, _ = pretrained.load_target("smollm2-135m-instruct")
    feature_width = len(SemiARConfig.for_target(target).target_layers) * target.config.hidden_size
    store = synthetic_store(args.sequences, args.length, args.prompt_length, feature_width, target.config.vocab_size, args.draft_vocab_size)
    results = {}
    for precision in tqdm(args.precisions, desc="precisions", unit="precision"):
        results[precision] = _profile(args, target, store, precision)
        tqdm.write(f"{precision}: {results[precision]['sequences_per_second']:.2f} sequences/s")
    if "float32" in results:
        for entry in results.values():
            entry["speedup_over_float32"] = entry["sequences_per_second"] / results["float32"]["sequences_per_second"]
    report = {"command": " ".join(["python", "benchmarks/profile_training.py", *(argv if argv is not None else sys.argv[1:])]),
              "settings": {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()},
              "results": results}
    write_json(args.output, report)
    return report


if __name__ == "__main__":
    main()
