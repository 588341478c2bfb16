"""Throughput against per-user speed under load (paper §5.3–5.4, Figures 7 and 8) on SmolLM2.

For each concurrency c, static batches of c different Spec-Bench first turns generate
``--max-new-tokens`` tokens per row with each verify policy; ``--rows R`` runs ceil(R / c) such
batches one after another (R different prompts at least), so that small c is not one prompt's
luck and the policies that learn (the fallback's prior, the online cost correction) see as many
rows at every c and both drafters (the shipped
semi-autoregressive drafter with its calibrated estimator; prompt lookup with the logistic model of its signals,
fitted offline and refitted online per sampling band, ``dspark.verify.online_estimator``, or with
``--lookup-estimator calibrated`` the offline fit through its per-band calibration), greedy and/or at temperature 1:

* plain decoding (nothing drafted), plain decoding again (``plain_again``, an A/A control: not a static policy,
  its ratio to plain decoding is the machine's noise), MTP-1 (``FixedLength(1)``), fixed γ (every drafted token),
  threshold (``Threshold(0.5)`` on the calibrated survival), vLLM's argmax rule, DSpark
  (``HardwareAwareScheduler``, column-wise admission), DSpark with the paper's candidate-wise
  admission (``dspark_candidates``), DSpark valuing every token alike, the paper's Θ (``dspark_theta``,
  ``static_batch=False``; the preset weighs rows by when they finish), DSpark opening a column when a wider step
  further on pays (``dspark_look_ahead``, ``look_ahead=True``) and DSpark whose row fallback drafts ⌈λ_r⌉ deep only (``dspark_shallow``,
  ``GoodputFallback(reach_cheaper_widths=False)``), the last six with the cost model ``wrap`` profiles on this machine
  (each its own copy, corrected online by its own steps, and its own estimator, as separate ``wrap`` calls would have);
* aggregate tokens/s (all rows' new tokens over the batches' wall time), per-user tokens/s (one
  row's tokens over its batch's time, averaged over rows), τ, the mean verify length per row and step
  (both over every batch of the last round), each policy's speed
  over plain decoding and over the best static policy (plain, MTP-1, fixed γ, threshold; those of
  ``--policies`` run) at that c;
* the same ratios for decoding alone (``decode_*``: the steps' own times from the step records, so
  the prompt's processing, which dominates short runs at large c, is left out); with ``--repeats N``
  every time is the median of N timed rounds, and each round's tokens/s and ratio to plain decoding in that
  round are kept (``round_*``, ``*_vs_plain_rounds``: their spread is the machine's noise), and each batch's tokens/s
  in each round (``round_batch_tokens_per_s``), with the median of the ratios to plain decoding on the same batch in
  the same round (``paired_*``, ``dspark.benchmarking.paired_ratio``: one generation that a burst of the machine's
  other work slowed does not move it); a round times every policy on each batch in turn, so
  that drift in the machine's speed hits every policy alike, in an order drawn anew (seeded) at every
  batch, so that no policy always runs after the same one (what ran before changes what the caches
  and the allocator hold);
* per policy, its steps' median time and count at each width (``step_ms_by_width``, the last round's; and
  ``step_ms_by_rows`` at each row count a batch shrank to as its rows finished) and, for a policy that reads a cost
  model, what that model prices the setting's steps and drafting passes at when the setting ends (``priced_step_ms``,
  ``priced_draft_ms``; ``priced_step_ms_by_rows`` at every row count up to the setting's, and ``cost_table``, the
  table those prices are read from): where a policy drafts and loses, these tell a wrong price from the machine's
  noise;
* ``*_frontier.png``: aggregate against per-user tokens/s (Figure 7); ``*_verify.png``: mean verify
  length against c (Figure 8). The JSON is written after every setting, with ``"complete": false`` until
  the last one is done, and records the code measured (git ids of ``dspark``, this script and
  ``pyproject.toml``, torch's and transformers' versions) and the machine (processor, threads);
  ``--resume`` goes on with a cut run of the same settings on the same code as committed and the same
  machine, keeping the drafters it finished (an unfinished drafter is measured again from its first
  setting: its policies learn across settings).

Every greedy output is checked against plain decoding's; sampled outputs are lossless by the
sampling law tests. Sampled runs ignore EOS, so that every policy generates the same number of tokens
(each draws different tokens, and rows ending early would make tokens per second compare different
amounts of work). They draw from a generator seeded by the round: in a round every policy starts from the same
seed, and each round draws anew, so that more rounds average the sampling's own spread. With one seed for every
round a policy that learns nothing (MTP-1) drew the very same tokens in every round, and its τ was one draw
however many rounds ran (1.29 at c = 1 and temperature 1 in the grid at ``c14d557`` and again at ``4076088``, where
other seeds on ten prompts gave it 1.25–1.27: probes, not kept).

    python benchmarks/bench_load.py --concurrency 1,4,16 --modes greedy --max-new-tokens 48 --rows 4
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import transformers
from tqdm import tqdm
from transformers.utils import logging as transformers_logging

import dspark
from dspark import pretrained, strategies
from dspark.benchmarking import STATIC_POLICIES, across_categories, generated_tokens, paired_ratio, write_json
from dspark.cost_models import OnlineCorrectedCostModel
from dspark.drafters import PromptLookupDrafter
from dspark.pretrained import encode_chat
from dspark.protocols import COST_MODEL_HOOKS, POLICY_HOOKS, hook
from dspark.training.data import eval_prompts
from dspark.verify import CalibrationFile, GoodputFallback, HardwareAwareScheduler, Threshold, calibrated_estimator, online_estimator

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
#: ``plain_again`` is plain decoding timed a second time, as a policy of its own: its ratio to plain decoding, which
#: ought to be 1, is what the machine's noise alone makes of two runs of one policy (an A/A control).
POLICIES = (*STATIC_POLICIES, "plain_again", "vllm_rule", "dspark", "dspark_candidates", "dspark_theta", "dspark_look_ahead", "dspark_shallow")
DRAFTERS = ("shipped", "prompt_lookup")
MODES = {"greedy": {"do_sample": False}, "temperature_1": {"do_sample": True, "temperature": 1.0}}


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,2,4,8,16,32")
    parser.add_argument("--modes", default="greedy,temperature_1")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1, help="timed rounds per setting; the median is reported")
    parser.add_argument("--rows", type=int, default=8, help="rows generated per setting at least: ceil(rows / c) batches of c different prompts")
    parser.add_argument("--drafters", default="shipped,prompt_lookup", help="among shipped, prompt_lookup")
    parser.add_argument("--policies", default=",".join(POLICIES), help=f"among {', '.join(POLICIES)}; plain is always run (every ratio is to it)")
    parser.add_argument("--lookup-calibration", default=str(RESULTS / "calibration_prompt_lookup"))
    parser.add_argument(
        "--lookup-estimator", default="online", choices=("online", "calibrated"),
        help="prompt lookup's estimator: the calibration file's logistic model refitted online per band (online_estimator), or as fitted, calibrated per band",
    )
    parser.add_argument("--data-dir", default=None, help="the prompt-data folder holding eval/ (default: dspark.training.default_data_dir())")
    parser.add_argument("--output", type=Path, default=RESULTS / "bench_load.json")
    parser.add_argument(
        "--resume", action="store_true",
        help="go on with the cut run in --output (same settings, same code as committed): the drafters it finished are kept, the others run from their first setting",
    )
    args = parser.parse_args(argv)
    args.concurrency = [int(value) for value in args.concurrency.split(",")]
    args.modes = [mode for mode in args.modes.split(",") if mode]
    args.drafters = [name for name in args.drafters.split(",") if name]
    if any(mode not in MODES for mode in args.modes) or min(args.concurrency) < 1:
        parser.error(f"--modes must be among {sorted(MODES)} and --concurrency ints >= 1, got {args.modes} and {args.concurrency}")
    if args.rows < 1:
        parser.error(f"--rows must be >= 1, got {args.rows}")
    if args.repeats < 1 or not args.drafters or any(name not in DRAFTERS for name in args.drafters):
        parser.error(f"--repeats must be >= 1 and --drafters among {DRAFTERS}, got {args.repeats} and {args.drafters}")
    chosen = {name for name in args.policies.split(",") if name} | {"plain"}
    if not chosen <= set(POLICIES):
        parser.error(f"--policies must be among {', '.join(POLICIES)}, got {args.policies!r}")
    args.policies = [name for name in POLICIES if name in chosen]
    return args


def _policies(target, drafter, make_confidence, gamma, names) -> dict:
    """Name → Strategy for one drafter, for the policies ``names`` only (the cost-model ones read or profile a
    table when built). Every policy that learns gets its own estimator (``make_confidence()``) and its own
    online-corrected cost model on the table ``wrap`` profiles here, as separate ``wrap`` calls would: shared,
    each one's decisions would follow what the others ran before it."""
    def costed():
        return dspark.profiled_cost_model(target, drafter, gamma)

    builders = {
        "plain": lambda: strategies.autoregressive(drafter),
        "plain_again": lambda: strategies.autoregressive(drafter),
        "mtp1": lambda: strategies.mtp1(drafter),
        "fixed_gamma": lambda: strategies.fixed_length(drafter, gamma),
        "threshold": lambda: dspark.Strategy(drafter=drafter, policy=Threshold(0.5), confidence=make_confidence(), max_draft_tokens=gamma),
        "vllm_rule": lambda: strategies.vllm_rule(drafter, gamma, costed(), make_confidence()),
        "dspark": lambda: strategies.dspark(drafter, gamma, costed(), make_confidence()),
        "dspark_candidates": lambda: strategies.dspark(drafter, gamma, costed(), make_confidence(), admission="candidates"),
        "dspark_theta": lambda: strategies.dspark(drafter, gamma, costed(), make_confidence(), static_batch=False),
        "dspark_look_ahead": lambda: strategies.dspark(drafter, gamma, costed(), make_confidence(), look_ahead=True),
        "dspark_shallow": lambda: dspark.Strategy(
            drafter=drafter, policy=HardwareAwareScheduler(max_draft_tokens=gamma, row_fallback=GoodputFallback(reach_cheaper_widths=False)),
            max_draft_tokens=gamma, cost_model=costed(), confidence=make_confidence(),
        ),
    }
    return {name: builders[name]() for name in names}


def _timed(model, batch, sampling, max_new_tokens, seed: int = 0) -> tuple[float, float, object]:
    """One generation of ``batch``, sampling (if it samples) from a generator seeded with ``seed``: (wall seconds,
    prompt processing included; decoding seconds, the steps alone from the step records; the result)."""
    generator = torch.Generator().manual_seed(seed)
    # Sampled runs ignore EOS: each policy draws other tokens, so rows would end at other lengths and
    # tokens per second would compare different amounts of work. Greedy outputs are equal anyway.
    ignore_eos = {"eos_token_id": []} if sampling.get("do_sample") else {}
    started = time.perf_counter()
    result = model.generate(**batch, max_new_tokens=max_new_tokens, generator=generator, **sampling, **ignore_eos)
    wall = time.perf_counter() - started
    return wall, sum(record.draft_seconds + record.verify_seconds for record in result.stats.records), result


def _entry(
    target, batches: list, walls: list[float], decodes: list[float], round_tokens: list[int], batch_rates: list[list[float]], results: list
) -> tuple[dict, list]:
    """A policy's medians over its timed rounds (each the sum over the batches), each round's tokens/s (wall and
    decoding alone) and each batch's in each round (``batch_rates``, wall), τ and the verify length over its last
    round's batches, the share of its rows' steps the drafter was asked for, and its tokens."""
    seconds, decode_seconds = statistics.median(walls), statistics.median(decodes)
    rows = batches[0]["input_ids"].shape[0]
    records = [record for result in results for record in result.stats.records]
    new_tokens = sum(result.stats.new_tokens for result in results)
    row_steps = sum(record.rows.numel() for record in records)
    verified = sum(int(record.verify_lengths.sum()) for record in records)
    # A generation run as plain decoding, or a row the fallback skips, is not asked for a draft.
    asked = sum(int(record.asked.sum()) for record in records)
    tokens = []
    for batch, result in zip(batches, results):
        tokens += generated_tokens(result.sequences, batch["input_ids"].shape[1], target.generation_config.eos_token_id)
    entry = {
        "aggregate_tokens_per_s": new_tokens / seconds,
        # A row waits for its own batch only, seconds / batches, for its new_tokens / (rows · batches) tokens.
        "per_user_tokens_per_s": new_tokens / rows / seconds,
        "decode_tokens_per_s": new_tokens / decode_seconds,
        "tau": new_tokens / max(row_steps, 1),
        "mean_verify_length": verified / max(row_steps, 1),
        "drafted_share": asked / max(row_steps, 1),
        "seconds": seconds,
        "decode_seconds": decode_seconds,
        "repeats": len(walls),
        "batches": len(batches),
        "round_tokens_per_s": [count / wall for count, wall in zip(round_tokens, walls)],
        "round_decode_tokens_per_s": [count / decode for count, decode in zip(round_tokens, decodes)],
        "round_batch_tokens_per_s": batch_rates,
    }
    return entry, tokens


def _run_setting(
    target, policies: dict, warm_up_policies: dict, batches: list, sampling, max_new_tokens: int, repeats: int, bar
) -> tuple[dict, dict]:
    """Every policy on every batch: an untimed warm-up of its twin in ``warm_up_policies`` on every batch, then
    ``repeats`` rounds that time every policy on each batch in turn, so that drift in the machine's speed hits all
    of them alike, in an order drawn anew (seeded) at every batch. Returns (entries, tokens) by name."""
    models = {name: dspark.SpeculativeModel(target, strategy) for name, strategy in policies.items()}
    for strategy in warm_up_policies.values():
        # A new batch shape pays one-off set-up (allocations, kernel choices, and the cost model's table of
        # that shape, profiled the first time): every batch, since each may have another prompt length. A twin
        # pays it, so that no timed policy learns from four-token generations of the very prompts it is timed on.
        warm_up = dspark.SpeculativeModel(target, strategy)
        for batch in batches:
            _timed(warm_up, batch, sampling, 4)
    rounds = {name: [] for name in models}  # per round: (wall, decode, results, each batch's tokens/s), summed over the batches
    names = list(models)
    for round_index in range(repeats):
        timed = {name: [] for name in models}
        for batch_index, batch in enumerate(batches):
            # A new order at every batch, drawn from a seeded generator: what ran before changes what the caches
            # and the allocator hold, so no policy may always follow the same one (turning one order round keeps
            # each policy's predecessor wherever it does not run first).
            order = random.Random(round_index * len(batches) + batch_index).sample(names, len(names))
            for name in order:
                timed[name].append(_timed(models[name], batch, sampling, max_new_tokens, seed=round_index))
        for name, runs in timed.items():
            walls, decodes, results = zip(*runs)
            rates = [result.stats.new_tokens / wall for wall, result in zip(walls, results)]
            rounds[name].append((sum(walls), sum(decodes), list(results), rates))
    entries, tokens = {}, {}
    for name, timed_rounds in rounds.items():
        walls, decodes, results, rates = zip(*timed_rounds)
        round_tokens = [sum(result.stats.new_tokens for result in round_results) for round_results in results]
        entries[name], tokens[name] = _entry(target, batches, list(walls), list(decodes), round_tokens, list(rates), results[-1])
        entries[name].update(_step_costs(policies[name], batches[0]["input_ids"].shape[0], results[-1]))
        bar.update(1)
    return entries, tokens


def _medians_by_width(by_width: dict[int, list[float]]) -> dict:
    """Width → [the median of its step times (ms), their count], widths as strings in order (JSON keys)."""
    return {str(width): [statistics.median(times), len(times)] for width, times in sorted(by_width.items())}


def _step_costs(strategy, rows: int, results: list) -> dict:
    """What a policy's steps of its last round took against what its cost model prices them at the setting's end,
    to tell a wrong price from the machine's noise where a policy drafts and loses: ``step_ms_by_width``, the median
    ``verify_seconds`` (ms) and the count of the steps of every batch row at each width 1 + max ℓ, and
    ``step_ms_by_rows`` the same at each row count the batch shrank to as rows finished; and for a policy that reads
    its cost model (``needs_cost_model``), ``priced_step_ms`` T(rows, w) for w = 1..4, ``priced_step_ms_by_rows``
    T(r, w) at every r ≤ rows (a step's price is a maximum over fewer rows, so a few-row cell priced high lifts the
    batch's), ``priced_draft_ms`` D(rows, depth) for depth 1..3 and ``cost_table``, the ``repr`` of the
    ``table_key`` of the table the prices are read from (None without one)."""
    by_rows: dict[int, dict[int, list[float]]] = {}
    for result in results:
        for record in result.stats.records[1:]:  # the first record is the prompt's
            width = 1 + int(record.verify_lengths.max())
            by_rows.setdefault(record.rows.numel(), {}).setdefault(width, []).append(1e3 * record.verify_seconds)
    by_rows_ms = {str(count): _medians_by_width(by_width) for count, by_width in sorted(by_rows.items())}
    costs = {"step_ms_by_width": by_rows_ms.get(str(rows), {}), "step_ms_by_rows": by_rows_ms}
    if hook(strategy.policy, "needs_cost_model", POLICY_HOOKS):
        cost_model = strategy.cost_model
        priced = {str(count): [1e3 * cost_model.step_time(count, width) for width in range(1, 5)] for count in range(1, rows + 1)}
        costs["priced_step_ms"], costs["priced_step_ms_by_rows"] = priced[str(rows)], priced
        costs["priced_draft_ms"] = [1e3 * cost_model.draft_time(rows, depth) for depth in range(1, 4)]
        # The online wrapper's answers change with every step, so it names no table; its base does.
        answering = cost_model.base if isinstance(cost_model, OnlineCorrectedCostModel) else cost_model
        table = hook(answering, "table_key", COST_MODEL_HOOKS)
        costs["cost_table"] = None if table is None else repr(table)
    return costs


def _plot(report: dict, output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for kind in ("frontier", "verify"):
        panels = [(drafter, mode) for drafter in report["results"] for mode in report["results"][drafter]]
        figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.2), squeeze=False)
        for axis, (drafter, mode) in zip(axes[0], panels):
            by_c = report["results"][drafter][mode]
            for policy in next(iter(by_c.values())):
                points = [(int(c), by_c[c][policy]) for c in by_c]
                if kind == "frontier":
                    axis.plot([p["per_user_tokens_per_s"] for _, p in points], [p["aggregate_tokens_per_s"] for _, p in points], marker="o", label=policy)
                else:
                    axis.plot([c for c, _ in points], [p["mean_verify_length"] for _, p in points], marker="o", label=policy)
            if kind == "frontier":
                axis.set(title=f"{drafter}, {mode}", xlabel="per-user tokens/s", ylabel="aggregate tokens/s")
            else:
                axis.set(title=f"{drafter}, {mode}", xlabel="concurrency c", ylabel="mean verify length per row and step", xscale="log", xticks=[int(c) for c in by_c])
                axis.set_xticklabels([str(c) for c in by_c])
            axis.legend(fontsize=8)
        figure.tight_layout()
        figure.savefig(output.with_name(f"{output.stem}_{kind}.png"), dpi=110)
        plt.close(figure)


#: What a run measures: a cut run is resumed only where these are as they were, unchanged since their commit.
_MEASURED_CODE = ("dspark", "benchmarks/bench_load.py", "pyproject.toml")


def _code_version() -> dict:
    """The git object ids of ``_MEASURED_CODE`` at HEAD, whether any of them differed from HEAD, the versions of
    torch and transformers and the machine (processor, threads: another machine's timings differ as much as other
    code's); ``{"unknown": why}`` where git cannot say or the ``dspark`` imported is not this checkout's."""
    if Path(dspark.__file__).resolve().parent != ROOT / "dspark":
        return {"unknown": f"dspark is imported from {Path(dspark.__file__).parent}, not {ROOT / 'dspark'}"}
    try:
        def git(*command: str) -> str:
            return subprocess.run(["git", "-C", str(ROOT), *command], capture_output=True, text=True, check=True).stdout.strip()

        objects = {path: git("rev-parse", f"HEAD:{path}") for path in _MEASURED_CODE}
        dirty = bool(git("status", "--porcelain", "--", *_MEASURED_CODE))
    except (OSError, subprocess.CalledProcessError) as error:
        return {"unknown": f"git could not read {', '.join(_MEASURED_CODE)} under {ROOT}: {getattr(error, 'stderr', None) or error}"}
    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "machine": dspark.fast_path._machine_fingerprint()}
    return {"objects": objects, "dirty": dirty, "versions": versions}


def _resumed(output: Path, fresh: dict) -> dict:
    """The cut run in ``output`` to go on with, checked to have measured what ``fresh`` would: its settings, and the
    same code (``_MEASURED_CODE``, unchanged since its commit then and now), versions and machine. A drafter it had not
    finished is dropped and measured again from its first setting: its policies learn across its settings (the
    fallback's prior, the online corrections), so a setting measured after the cut with fresh policies would not
    be what an uncut run measures; each drafter's policies start afresh anyway."""
    if not output.exists():
        raise SystemExit(f"--resume: {output} does not exist")
    previous = json.loads(output.read_text())
    if previous.get("complete") is not False:
        raise SystemExit(f"--resume: {output} is not a cut run (complete: {previous.get('complete')!r})")
    if previous.get("settings") != fresh["settings"]:
        raise SystemExit(f"--resume: {output} was run with settings {previous.get('settings')}, not {fresh['settings']}")
    if "unknown" in fresh["code"] or fresh["code"]["dirty"] or previous.get("code") != fresh["code"]:
        raise SystemExit(f"--resume: {output} measured code {previous.get('code')}, this is {fresh['code']}: both must be the same, as committed, on one machine")
    settings = fresh["settings"]
    finished = [
        drafter for drafter, by_mode in previous["results"].items()
        if all(str(c) in by_mode.get(mode, {}) for mode in settings["modes"] for c in settings["concurrency"])
    ]
    return {
        **previous,
        "results": {drafter: previous["results"][drafter] for drafter in finished},
        "mismatches": [mismatch for mismatch in previous["mismatches"] if mismatch["drafter"] in finished],
        "resumed": [*previous.get("resumed", []), fresh["command"]],
    }


def main(argv: list[str] | None = None) -> dict:
    args = _parse_args(argv)
    for name in ("output", "lookup_calibration", "data_dir"):  # one file, however it was named
        if getattr(args, name) is not None:
            setattr(args, name, Path(getattr(args, name)).resolve())
    settings = {name: (str(value) if isinstance(value, Path) else value) for name, value in vars(args).items() if name != "resume"}
    report = {
        "command": shlex.join([sys.executable, *sys.argv]), "code": _code_version(), "settings": settings, "results": {}, "mismatches": [],
    }
    if args.resume:
        report = _resumed(args.output, report)
    transformers_logging.disable_progress_bar()
    bundle = pretrained.load()
    target = bundle.target
    batches_at = {c: -(-args.rows // c) for c in args.concurrency}
    needed = max(c * batches_at[c] for c in args.concurrency)
    messages = [prompt.message for prompt in across_categories(eval_prompts(args.data_dir, spec_per_category=max(1, -(-needed // 13))))]
    if len(messages) < needed:
        raise SystemExit(f"--rows {args.rows} and --concurrency {args.concurrency} need {needed} Spec-Bench prompts, the eval set has {len(messages)}")
    lookup_calibration = CalibrationFile.load(args.lookup_calibration)
    lookup_estimator = online_estimator if args.lookup_estimator == "online" else calibrated_estimator
    drafters = {
        "shipped": (bundle.drafter, lambda: calibrated_estimator(bundle.drafter.calibration), bundle.drafter.max_draft_tokens),
        "prompt_lookup": (PromptLookupDrafter(), lambda: lookup_estimator(lookup_calibration), PromptLookupDrafter().max_draft_tokens),
    }
    drafters = {name: drafters[name] for name in args.drafters}
    runs = len(drafters) * len(args.modes) * len(args.concurrency) * len(args.policies)
    with tqdm(total=runs, desc="load runs", unit="run", mininterval=30) as bar:
        for drafter_name, (drafter, make_confidence, gamma) in drafters.items():
            policies = warm_up_policies = None  # built where this drafter has a setting left to measure
            for mode in args.modes:
                for c in args.concurrency:
                    if str(c) in report["results"].get(drafter_name, {}).get(mode, {}):
                        bar.update(len(args.policies))  # measured, with the rest of this drafter, before the run was cut
                        continue
                    if policies is None:
                        policies = _policies(target, drafter, make_confidence, gamma, args.policies)
                        warm_up_policies = _policies(target, drafter, make_confidence, gamma, args.policies)
                    batches = [encode_chat(bundle.tokenizer, messages[start : start + c]) for start in range(0, c * batches_at[c], c)]
                    entries, tokens = _run_setting(target, policies, warm_up_policies, batches, MODES[mode], args.max_new_tokens, args.repeats, bar)
                    if mode == "greedy":
                        report["mismatches"] += [{"drafter": drafter_name, "c": c, "policy": name} for name in tokens if tokens[name] != tokens["plain"]]
                    plain = entries["plain"]["aggregate_tokens_per_s"]
                    static = [name for name in STATIC_POLICIES if name in entries]
                    best_static = max(entries[name]["aggregate_tokens_per_s"] for name in static)
                    plain_decode = entries["plain"]["decode_tokens_per_s"]
                    best_static_decode = max(entries[name]["decode_tokens_per_s"] for name in static)
                    for entry in entries.values():
                        entry["paired_vs_plain"], entry["paired_vs_plain_rounds"] = paired_ratio(
                            entry["round_batch_tokens_per_s"], entries["plain"]["round_batch_tokens_per_s"]
                        )
                    best_static_paired = max(entries[name]["paired_vs_plain"] for name in static)
                    for entry in entries.values():
                        entry["paired_vs_best_static"] = entry["paired_vs_plain"] / best_static_paired
                        entry["vs_plain"] = entry["aggregate_tokens_per_s"] / plain
                        entry["vs_best_static"] = entry["aggregate_tokens_per_s"] / best_static
                        entry["decode_vs_plain"] = entry["decode_tokens_per_s"] / plain_decode
                        entry["decode_vs_best_static"] = entry["decode_tokens_per_s"] / best_static_decode
                        # Paired within a round (every policy ran each batch in turn), so the rounds' spread shows the noise.
                        entry["vs_plain_rounds"] = [mine / theirs for mine, theirs in zip(entry["round_tokens_per_s"], entries["plain"]["round_tokens_per_s"])]
                        entry["decode_vs_plain_rounds"] = [
                            mine / theirs for mine, theirs in zip(entry["round_decode_tokens_per_s"], entries["plain"]["round_decode_tokens_per_s"])
                        ]
                    report["results"].setdefault(drafter_name, {}).setdefault(mode, {})[str(c)] = entries
                    tqdm.write(f"{drafter_name} {mode} c={c}: " + ", ".join(f"{name} {e['vs_plain']:.2f}x, decoding {e['decode_vs_plain']:.2f}x (l {e['mean_verify_length']:.2f})" for name, e in entries.items()))
                    write_json(args.output, {**report, "complete": False})  # a long run that is cut keeps what it measured
    report["complete"] = True
    write_json(args.output, report)
    _plot(report, args.output)
    print(f"wrote {args.output}; greedy mismatches: {len(report['mismatches'])}")
    return report


if __name__ == "__main__":
    main()
