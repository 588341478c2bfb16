"""What the CPU fast path saves on SmolLM2's verify steps, and what intercepting torch calls costs.

For each new-token count of ``--tokens`` at ``--context`` cached tokens (batch 1), interleaved over
``--rounds`` rounds so that drift in machine load hits every arm alike, the median seconds of one
target forward:

* ``plain``: the model's own forward;
* ``fast_path``: inside ``FastPath.active()`` (``dspark.wrap``'s default on a CPU);
* ``fast_path_one_row_weights``: the same on a second fast path whose one-row products never read a
  weight copy, what revision 3 did everywhere (``FastPath.measure_one_row`` decides that per machine and
  model; its measurement, made in this run on a fresh cache, is in ``one_row``); where one-row products run
  transposed (below), they run so here too, on the weights, so at one token this arm is the fast path's;
* ``fast_path_as_ranked``: the same on a fast path whose products never all run transposed, each product as its
  own ranking, what revision 5 did everywhere (``FastPath.measure_transposed`` decides that per machine, model
  and row count; its measurement is in ``transposed``);
* ``intercepted``: the plain forward under a ``TorchFunctionMode`` that passes every call through
  unchanged, which is what routing by a mode costs before it does any work (the reason the fast
  path routes ``F.linear`` alone).

And, for ``plain``, ``fast_path`` and ``fast_path_one_row_weights``, what a change of width costs
(``*_after_switch_ms``): the median of a w-token forward that follows ``--switch-after`` one-token forwards, as a verify step after a run
of plain steps does (the fallback's probes, a scheduler that verified nothing for a while), against
the steady cost of w-token forwards in a row (``*_steady_ms``), all on one cache of ``--context`` tokens,
each arm in a block of its own.

    python benchmarks/bench_fast_path.py --tokens 1,2,8 --rounds 15
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

import attrs
import torch
from torch.overrides import TorchFunctionMode
from tqdm import tqdm

import dspark
from dspark.benchmarking import write_json
from dspark.cost_models.profiling import _cache_layout, _random_cache, _step_inputs, _time_forward, measure_step_time

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


class _PassThrough(TorchFunctionMode):
    """Intercepts every torch call and runs it unchanged."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="1,2,8", help="new tokens per forward, comma-separated")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--switch-after", type=int, default=15, help="one-token forwards before each measured change of width")
    parser.add_argument("--output", type=Path, default=RESULTS / "bench_fast_path.json")
    args = parser.parse_args(argv)
    args.tokens = [int(value) for value in args.tokens.split(",")]
    if min(args.tokens) < 1 or args.rounds < 1 or args.context < 0 or args.switch_after < 1:
        parser.error(
            f"--tokens must be ints >= 1, --rounds and --switch-after >= 1 and --context >= 0, "
            f"got {args.tokens}, {args.rounds}, {args.switch_after}, {args.context}"
        )
    return args


def _switch_costs(target, fast_path, one_row_weights, args) -> dict:
    """Per width w of ``--tokens``: ``{arm}_steady_ms`` and ``{arm}_after_switch_ms`` (module docstring), medians over
    ``--rounds`` rounds. Each arm runs all its rounds in a block of its own: interleaved, one arm's forwards
    would warm the weights the other reads after its change of width."""
    layout = _cache_layout(target, target.device)
    generator = torch.Generator().manual_seed(0)
    cache = _random_cache(layout, 1, args.context, target.device, generator)
    inputs = {tokens: _step_inputs(target, 1, tokens, args.context, cache, generator) for tokens in {1, *args.tokens}}
    paths = {"plain": None, "fast_path": fast_path, "fast_path_one_row_weights": one_row_weights}
    times = {(name, tokens, kind): [] for name in paths for tokens in args.tokens for kind in ("steady", "after_switch")}
    blocks = [(name, path) for name, path in paths.items() for _ in range(args.rounds)]
    for name, path in tqdm(blocks, desc="changes of width", unit="round"):
        for tokens in args.tokens:
            for _ in range(args.switch_after):
                _time_forward(target, inputs[1], path)
            times[(name, tokens, "after_switch")].append(_time_forward(target, inputs[tokens], path))
            steady = [_time_forward(target, inputs[tokens], path) for _ in range(4)]
            times[(name, tokens, "steady")].append(statistics.median(steady[1:]))
    return {
        tokens: {f"{name}_{kind}_ms": statistics.median(times[(name, tokens, kind)]) * 1e3 for name in paths for kind in ("steady", "after_switch")}
        for tokens in args.tokens
    }


def main(argv: list[str] | None = None) -> dict:
    args = _parse_args(argv)
    bundle = dspark.pretrained.load("smollm2-135m-instruct", drafter="prompt-lookup")
    target = bundle.target
    # A fresh cache, so that the one-row measurement recorded is this run's: dspark.wrap's shared fast path
    # would read the one cached on an earlier day.
    cache = tempfile.TemporaryDirectory()
    fast_path = dspark.fast_path.FastPath.for_model(target, cache_dir=cache.name)
    one_row = fast_path.measure_one_row(target)
    one_row_weights = dspark.fast_path.FastPath.for_model(target, cache_dir=cache.name, progress=False)
    one_row_weights._use_one_row(dspark.fast_path.linear_weights(target), False)
    transposed = fast_path.measure_transposed(target)
    as_ranked = dspark.fast_path.FastPath.for_model(target, cache_dir=cache.name, progress=False)
    as_ranked._use_transposed(dspark.fast_path.linear_weights(target), set())
    arms = {
        "plain": lambda tokens: measure_step_time(target, 1, tokens, args.context, repeats=3).seconds,
        "fast_path": lambda tokens: measure_step_time(target, 1, tokens, args.context, fast_path=fast_path, repeats=3).seconds,
        "fast_path_one_row_weights": lambda tokens: measure_step_time(target, 1, tokens, args.context, fast_path=one_row_weights, repeats=3).seconds,
        "fast_path_as_ranked": lambda tokens: measure_step_time(target, 1, tokens, args.context, fast_path=as_ranked, repeats=3).seconds,
    }

    def intercepted(tokens: int) -> float:
        with _PassThrough():
            return measure_step_time(target, 1, tokens, args.context, repeats=3).seconds

    arms["intercepted"] = intercepted
    seconds = {tokens: {name: [] for name in arms} for tokens in args.tokens}
    for _ in tqdm(range(args.rounds), desc="rounds", unit="round"):
        for tokens in args.tokens:
            for name, arm in arms.items():
                seconds[tokens][name].append(arm(tokens))
    switches = _switch_costs(target, fast_path, one_row_weights, args)
    results = {}
    for tokens, by_arm in seconds.items():
        median = {name: statistics.median(values) for name, values in by_arm.items()}
        results[str(tokens)] = {
            **{f"{name}_ms": value * 1e3 for name, value in median.items()},
            "fast_path_speedup": median["plain"] / median["fast_path"],
            "one_row_weights_speedup": median["plain"] / median["fast_path_one_row_weights"],
            "as_ranked_speedup": median["plain"] / median["fast_path_as_ranked"],
            "interception_ms": (median["intercepted"] - median["plain"]) * 1e3,
            **switches[tokens],
        }
        print(f"{tokens} new tokens: plain {median['plain'] * 1e3:.1f} ms, fast path {median['fast_path'] * 1e3:.1f} ms "
              f"({results[str(tokens)]['fast_path_speedup']:.2f}x; one-row products on the weights "
              f"{median['fast_path_one_row_weights'] * 1e3:.1f} ms, every product as ranked {median['fast_path_as_ranked'] * 1e3:.1f} ms), a pass-through TorchFunctionMode adds {results[str(tokens)]['interception_ms']:.1f} ms; "
              f"after {args.switch_after} one-token forwards: plain {switches[tokens]['plain_after_switch_ms']:.1f} ms "
              f"(steady {switches[tokens]['plain_steady_ms']:.1f}), fast path {switches[tokens]['fast_path_after_switch_ms']:.1f} ms "
              f"(steady {switches[tokens]['fast_path_steady_ms']:.1f})")
    report = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "settings": {**vars(args), "output": str(args.output), "threads": torch.get_num_threads(), "fast_path_revision": dspark.fast_path.REVISION},
        "machine": dspark.fast_path._machine_fingerprint(),
        "one_row": None if one_row is None else {**attrs.asdict(one_row), "copies": one_row.copies},
        "transposed": {str(count): {**attrs.asdict(choice), "transposed": choice.transposed} for count, choice in transposed.items()},
        "results": results,
    }
    write_json(args.output, report)
    cache.cleanup()
    print(f"wrote {args.output}")
    return report


if __name__ == "__main__":
    main()
