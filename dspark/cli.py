"""The ``dspark`` command: stream a speculative answer from the embedded model, optionally against plain HF."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import TextStreamer
from transformers.utils import logging as transformers_logging

import dspark
from dspark import pretrained
from dspark.drafters import SemiARConfig
from dspark.fast_path import linear_weights

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dspark", description="Lossless speculative decoding for Hugging Face models.")
    commands = parser.add_subparsers(dest="command", required=True)
    generate = commands.add_parser("generate", help="answer a chat prompt with speculative decoding")
    generate.add_argument("prompt", help="the user message; the model's chat template is applied")
    generate.add_argument("--model", default="smollm2-135m-instruct", choices=sorted(pretrained.KNOWN_MODELS))
    generate.add_argument("--max-new-tokens", type=int, default=128)
    generate.add_argument(
        "--drafter", default=None,
        help=f"a trained SemiARDrafter directory (dspark train --output), or {pretrained.PROMPT_LOOKUP!r}; default: the drafter shipped for the model",
    )
    generate.add_argument("--max-draft-tokens", type=int, default=None, help="block width γ (default: the drafter's)")
    generate.add_argument("--compare", action="store_true", help="also time plain model.generate and check the outputs agree")
    generate.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    generate.add_argument("--temperature", type=float, default=1.0)
    generate.add_argument("--top-p", type=float, default=None)
    generate.add_argument("--seed", type=int, default=0, help="seed of the sampling generator")
    generate.add_argument("--no-fast-path", action="store_true", help="run dspark's forwards as plain forwards (see docs/fast_path.rst)")
    fast_path = commands.add_parser("fast-path", help="show the linear formulation the fast path chose per shape and row count (measuring once if needed)")
    fast_path.add_argument("--model", default="smollm2-135m-instruct", choices=sorted(pretrained.KNOWN_MODELS))
    calibrate = commands.add_parser("calibrate", help="fit the drafter's survival calibration on held-out training prompts (resumable)")
    calibrate.add_argument("--model", default="smollm2-135m-instruct", choices=sorted(pretrained.KNOWN_MODELS))
    calibrate.add_argument("--drafter", default=None, help=f"a trained SemiARDrafter directory or {pretrained.PROMPT_LOOKUP!r}; default: the drafter shipped for the model")
    calibrate.add_argument("--output", default=None, help="where calibration.json goes (default: the drafter's directory; needed for prompt-lookup)")
    calibrate.add_argument("--prompts", type=int, default=160, help="calibration-split prompts (never eval/) to generate for")
    calibrate.add_argument("--max-new-tokens", type=int, default=128)
    calibrate.add_argument("--batch-size", type=int, default=8)
    calibrate.add_argument("--bands", default="greedy,low,high", help="sampling bands to fit: greedy, low (temperature 0.7), high (temperature 1)")
    calibrate.add_argument("--method", default="isotonic", choices=["temperature", "isotonic"], help="isotonic: a monotone map per position (measured best here); temperature: Sequential Temperature Scaling (paper §3.2.1)")
    calibrate.add_argument("--report-share", type=float, default=0.25, help="share of the prompts held out for the report")
    calibrate.add_argument("--data-dir", default=None, help="the prompt-data folder holding train/ (default: $DSPARK_DATA_DIR, else shared/data found from the working directory up)")
    calibrate.add_argument("--work-dir", default=None, help="logs, report and plots (default: <cache>/calibrate/<model>/<drafter>)")
    calibrate.add_argument("--seed", type=int, default=0)
    train = commands.add_parser("train", help="distil a semi-autoregressive DSpark drafter from the model (resumable)")
    train.add_argument("--output", help="directory for the trained drafter (safetensors + config.json); needed unless --stage data")
    train.add_argument("--model", default="smollm2-135m-instruct", choices=sorted(pretrained.KNOWN_MODELS))
    train.add_argument("--data-dir", default=None, help="the prompt-data folder holding train/ (default: $DSPARK_DATA_DIR, else shared/data found from the working directory up)")
    train.add_argument("--work-dir", default=None, help="regenerated data and checkpoints (default: <cache>/distill/<model>)")
    train.add_argument("--prompts", type=int, default=800, help="training prompts to regenerate answers for")
    train.add_argument("--max-new-tokens", type=int, default=256)
    train.add_argument("--modes", default="greedy,sample", help="answers to train on: greedy and/or sample (temperature 1) by the target, reference (the dataset's own answers)")
    train.add_argument("--generate-batch-size", type=int, default=8)
    train.add_argument(
        "--generate-dtype", default=None, choices=["float32", "bfloat16", "float16"],
        help="answer with a copy of the target in this dtype (bfloat16 decodes faster on CPUs with AMX and on GPUs); labels always come from the target",
    )
    train.add_argument(
        "--stage", default="all", choices=["all", "data", "train"],
        help="data: regenerate answers and build the target store, then stop; train: use the answers regenerated so far; all: both",
    )
    train.add_argument("--steps", type=int, default=2000)
    train.add_argument("--learning-rate", type=float, default=3e-4)
    train.add_argument("--warmup-steps", type=int, default=50)
    train.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    train.add_argument(
        "--own-weight", type=int, default=1,
        help="draw each of the target's own answers this many times as often as a dataset answer (--modes reference)",
    )
    train.add_argument("--sequences-per-step", type=int, default=4)
    train.add_argument("--anchors-per-sequence", type=int, default=16, help="anchor blocks drawn from each sequence per step")
    train.add_argument("--loss-weights", default="0.1,0.9,1.0", help="α_ce,α_tv,α_conf (paper §3.3: 0.1,0.9,1.0)")
    train.add_argument("--top-k", type=int, default=32, help="target tokens kept per position for the TV and confidence losses")
    train.add_argument("--max-sequence-tokens", type=int, default=768)
    train.add_argument("--max-draft-tokens", "--block-size", dest="max_draft_tokens", type=int, default=7, help="γ, the block width the drafter is trained for (--block-size: deprecated spelling)")
    train.add_argument("--sequential", default="markov", choices=["markov", "rnn", "none"])
    train.add_argument("--backbone", default="parallel", choices=["parallel", "autoregressive"], help="autoregressive: the EAGLE/MTP-like ablation")
    train.add_argument("--precision", default="float32", choices=["float32", "bfloat16", "float16"], help="autocast dtype of the drafter's forward while training (weights stay float32); bfloat16 is 2-3.5x faster on CPUs with AVX512-BF16")
    train.add_argument("--anchor-input", default="embedding", choices=["embedding", "feature"], help="feature: the anchor also reads the target feature of the position before it (drafter v2, EAGLE-style)")
    train.add_argument("--layers", type=int, default=2)
    train.add_argument("--intermediate-size", type=int, default=1024)
    train.add_argument("--rank", type=int, default=64)
    train.add_argument("--draft-vocab-size", type=int, default=8192)
    train.add_argument("--target-layers", default=None, help="comma-separated hidden-state indices (default: 3 evenly spaced)")
    train.add_argument("--validation-share", type=float, default=0.05, help="regenerated sequences held out to score memorising vs learning")
    train.add_argument("--seed", type=int, default=0)
    return parser


def _sampling(args) -> dict:
    """Generate keywords shared by dspark and HF."""
    if not args.sample:
        return {"do_sample": False}
    # top_k=0 means "off" to both; left unset, HF would fill in its default of 50 and sample differently.
    return {"do_sample": True, "temperature": args.temperature, "top_p": args.top_p, "top_k": 0}


def _new_tokens(sequences: torch.Tensor, prompt_length: int, eos_token_id: int) -> list[int]:
    """Row 0's generated tokens up to and including its first EOS (dspark pads after it, HF stops)."""
    tokens = sequences[0, prompt_length:].tolist()
    return tokens[: tokens.index(eos_token_id) + 1] if eos_token_id in tokens else tokens


def _run_dspark(bundle, prompt, args) -> tuple[list[int], float]:
    """Stream the speculative answer; print and return its tokens and tokens/s."""
    model = dspark.wrap(bundle.target, bundle.drafter, max_draft_tokens=args.max_draft_tokens, fast_path=False if args.no_fast_path else None)
    generator = torch.Generator().manual_seed(args.seed) if args.sample else None
    streamer = TextStreamer(bundle.tokenizer, skip_prompt=True, skip_special_tokens=True)
    started = time.perf_counter()
    result = model.generate(**prompt, max_new_tokens=args.max_new_tokens, generator=generator, streamer=streamer, **_sampling(args))
    seconds = time.perf_counter() - started
    tokens = _new_tokens(result.sequences, prompt["input_ids"].shape[1], bundle.target.generation_config.eos_token_id)
    speed = len(tokens) / seconds
    print(f"\n[dspark, {type(bundle.drafter).__name__}] {len(tokens)} tokens in {seconds:.2f} s: {speed:.1f} tokens/s, τ {result.stats.tau:.2f}, {result.stats.steps} steps")
    return tokens, speed


def _run_hf(bundle, prompt, args) -> tuple[list[int], float]:
    """Time plain ``model.generate`` with the same prompt and settings; print and return tokens and tokens/s."""
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    sequences = bundle.target.generate(**prompt, max_new_tokens=args.max_new_tokens, **_sampling(args))
    seconds = time.perf_counter() - started
    tokens = _new_tokens(sequences, prompt["input_ids"].shape[1], bundle.target.generation_config.eos_token_id)
    speed = len(tokens) / seconds
    print(f"[hf generate] {len(tokens)} tokens in {seconds:.2f} s: {speed:.1f} tokens/s")
    return tokens, speed


def _generate(args) -> None:
    bundle = pretrained.load(args.model, drafter=args.drafter)
    messages = [{"role": "user", "content": args.prompt}]
    prompt = bundle.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    prompt = {"input_ids": prompt["input_ids"], "attention_mask": prompt["attention_mask"]}
    if args.compare:
        # One short untimed call so neither timed run pays the first-call setup alone.
        bundle.target.generate(**prompt, max_new_tokens=2, do_sample=False)
    tokens, speed = _run_dspark(bundle, prompt, args)
    if not args.compare:
        return
    hf_tokens, hf_speed = _run_hf(bundle, prompt, args)
    print(f"speedup {speed / hf_speed:.2f}x")
    if args.sample:
        print("outputs: sampled, so not compared token by token")
    else:
        print(f"greedy outputs identical: {tokens == hf_tokens}")


def _loss_weights(text: str, parser: argparse.ArgumentParser) -> tuple[float, ...]:
    """Parse α_ce,α_tv,α_conf; ``TrainConfig`` decides what is allowed."""
    try:
        weights = tuple(float(value) for value in text.split(","))
        from dspark.training import TrainConfig

        TrainConfig(loss_weights=weights)
    except ValueError as error:
        parser.error(f"--loss-weights {text!r}: {error}")
    return weights


def _train(args, parser: argparse.ArgumentParser) -> None:
    """Parse into configs and hand over to ``dspark.training.distill_drafter``."""
    from dspark import training

    try:
        data = training.DataConfig(
            prompts=args.prompts, max_new_tokens=args.max_new_tokens, modes=tuple(mode for mode in args.modes.split(",") if mode),
            generate_batch_size=args.generate_batch_size, top_k=args.top_k, max_sequence_tokens=args.max_sequence_tokens,
            validation_share=args.validation_share, own_weight=args.own_weight, seed=args.seed,
            generate_dtype=args.generate_dtype,
        )
        train_config = training.TrainConfig(
            steps=args.steps, learning_rate=args.learning_rate, warmup_steps=args.warmup_steps, sequences_per_step=args.sequences_per_step,
            anchors_per_sequence=args.anchors_per_sequence, weight_decay=args.weight_decay, loss_weights=args.loss_weights, seed=args.seed,
            precision=args.precision,
        )
        # The data folder last: a wrong setting is named even where no data folder is found.
        data_dir = Path(args.data_dir) if args.data_dir else training.default_data_dir()
    except ValueError as error:
        parser.error(str(error))
    work_dir = Path(args.work_dir) if args.work_dir else pretrained.default_cache_dir() / "distill" / args.model
    if args.stage == "train" and not (work_dir / "data.jsonl").is_file():
        parser.error(f"--stage train: no regenerated answers in {str(work_dir / 'data.jsonl')!r}; run --stage data or all first")
    target, tokenizer = pretrained.load_target(args.model)
    overrides = dict(
        max_draft_tokens=args.max_draft_tokens, num_layers=args.layers, intermediate_size=args.intermediate_size,
        sequential=None if args.sequential == "none" else args.sequential, backbone=args.backbone, rank=args.rank,
        draft_vocab_size=args.draft_vocab_size, anchor_input=args.anchor_input,
    )
    if args.target_layers:
        overrides["target_layers"] = tuple(int(value) for value in args.target_layers.split(","))
    config = SemiARConfig.for_target(target, **overrides)
    started = time.perf_counter()
    drafter = training.distill_drafter(target, tokenizer, config, work_dir, data, train_config, data_dir, stage=args.stage, log=tqdm.write)
    if drafter is not None:
        drafter.save_pretrained(args.output, dtype=torch.float16)
        print(f"saved to {args.output} after {time.perf_counter() - started:.0f} s")


def _calibrate(args, parser: argparse.ArgumentParser) -> None:
    """Parse into a CollectConfig and hand over to ``dspark.training.calibrate.calibrate_drafter``."""
    from dspark.training import calibrate, data
    from dspark.verify.calibration import file_fingerprint

    try:
        config = calibrate.CollectConfig(
            prompts=args.prompts, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
            bands=tuple(band for band in args.bands.split(",") if band), seed=args.seed,
        )
    except ValueError as error:
        parser.error(str(error))
    directory = pretrained.shipped_drafter(args.model) if args.drafter is None else None if args.drafter == pretrained.PROMPT_LOOKUP else Path(args.drafter)
    output = Path(args.output) if args.output else directory
    if output is None:
        parser.error("--output is needed with --drafter prompt-lookup (or a model without a shipped drafter)")
    try:
        data_dir = Path(args.data_dir) if args.data_dir else data.default_data_dir()
    except ValueError as error:
        parser.error(str(error))
    fingerprint = None if directory is None else file_fingerprint(directory / "model.safetensors")
    work_dir = Path(args.work_dir) if args.work_dir else pretrained.default_cache_dir() / "calibrate" / args.model / (fingerprint or pretrained.PROMPT_LOOKUP)
    bundle = pretrained.load(args.model, drafter=args.drafter)
    outcome = calibrate.calibrate_drafter(
        bundle.target, bundle.tokenizer, bundle.drafter, work_dir, output, config, method=args.method,
        report_share=args.report_share, data_dir=data_dir, fingerprint=fingerprint,
    )
    for name, bands in outcome.report.items():
        for band, report in bands.items():
            raw, calibrated = report["raw"]["prefix"], report["calibrated"]["prefix"]
            worst = lambda positions: max((p["ece"] for p in positions if p["count"]), default=float("nan"))  # noqa: E731
            print(f"{name:18s} {band:7s} worst ECE of a_k over positions: raw {worst(raw):.3f}, calibrated {worst(calibrated):.3f}")
    for name, path in outcome.paths.items():
        print(f"{name}: {path}")


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``dspark`` console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "train" and args.stage != "data" and not args.output:
        parser.error("--output is needed unless --stage data")
    if args.command == "train":
        args.loss_weights = _loss_weights(args.loss_weights, parser)
    if args.command == "generate" and not args.sample and (args.temperature != 1.0 or args.top_p is not None):
        parser.error("--temperature and --top-p need --sample")
    # Loading progress bars would interleave with the streamed answer.
    transformers_logging.disable_progress_bar()
    if args.command == "generate":
        _generate(args)
    elif args.command == "train":
        _train(args, parser)
    elif args.command == "calibrate":
        _calibrate(args, parser)
    elif args.command == "fast-path":
        bundle = pretrained.load(args.model)
        weights = [weight for module in (bundle.target, bundle.drafter) if isinstance(module, torch.nn.Module) for weight in linear_weights(module)]
        print(dspark.wrap(bundle.target, bundle.drafter, fast_path=True).fast_path.describe(weights))
