"""The ``dspark`` command: stream a speculative answer from the embedded model, optionally against plain HF."""

from __future__ import annotations

import argparse
import collections
import hashlib
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import TextStreamer
from transformers.utils import logging as transformers_logging

import dspark
from dspark import pretrained
from dspark.drafters import SemiARConfig, SemiARDrafter, TargetSignature, distill
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
    train = commands.add_parser("train", help="distil a semi-autoregressive DSpark drafter from the model (resumable)")
    train.add_argument("--output", help="directory for the trained drafter (safetensors + config.json); needed unless --stage data")
    train.add_argument("--model", default="smollm2-135m-instruct", choices=sorted(pretrained.KNOWN_MODELS))
    train.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[1].parent / "shared" / "data" / "train"))
    train.add_argument("--work-dir", default=None, help="regenerated data and checkpoints (default: <cache>/distill/<model>)")
    train.add_argument("--prompts", type=int, default=800, help="training prompts to regenerate answers for")
    train.add_argument("--max-new-tokens", type=int, default=256)
    train.add_argument("--modes", default="greedy,sample", help="answers to train on: greedy and/or sample (temperature 1) by the target, reference (the dataset's own answers)")
    train.add_argument("--generate-batch-size", type=int, default=8)
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
    train.add_argument("--block-size", type=int, default=7, help="γ")
    train.add_argument("--sequential", default="markov", choices=["markov", "rnn", "none"])
    train.add_argument("--backbone", default="parallel", choices=["parallel", "autoregressive"], help="autoregressive: the EAGLE/MTP-like ablation")
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
        distill.TrainConfig(loss_weights=weights)
    except ValueError as error:
        parser.error(f"--loss-weights {text!r}: {error}")
    return weights


def _train(args) -> None:
    target, tokenizer = pretrained.load_target(args.model)
    signature = TargetSignature.of(target)
    work_dir = Path(args.work_dir) if args.work_dir else pretrained.default_cache_dir() / "distill" / args.model
    data = work_dir / "data.jsonl"
    if args.stage != "train":
        prompts = distill.training_prompts(args.data_dir, "train", limit=args.prompts, seed=args.seed)
        modes = tuple(mode for mode in args.modes.split(",") if mode)
        with tqdm(total=len(prompts) * len(modes), desc="regenerating answers", unit="prompt") as bar:
            distill.regenerate(
                target, tokenizer, prompts, data, max_new_tokens=args.max_new_tokens, modes=modes,
                batch_size=args.generate_batch_size, seed=args.seed, progress=bar,
            )
    if not data.is_file():
        raise SystemExit(f"no regenerated answers in {data}: run with --stage data or all first")
    records = distill.read_sequences(data)
    counts = collections.Counter(record["mode"] for record in records)
    print(f"{len(records)} sequences ({dict(counts)}), {sum(len(r['response_ids']) for r in records)} response tokens in {data}")
    layers = tuple(int(v) for v in args.target_layers.split(",")) if args.target_layers else distill.default_target_layers(target.config.num_hidden_layers)
    config = SemiARConfig(
        target=signature, target_layers=layers, block_size=args.block_size, num_layers=args.layers,
        num_heads=target.config.num_attention_heads, intermediate_size=args.intermediate_size,
        sequential=None if args.sequential == "none" else args.sequential, backbone=args.backbone, rank=args.rank,
        draft_vocab_size=args.draft_vocab_size,
    )
    torch.manual_seed(args.seed)
    held_out = [distill.held_out_for_validation(record["id"], args.validation_share) for record in records]
    # The target's own answers (not the datasets'): what drafting at inference time sees.
    own = [record["mode"] != "reference" for record in records]
    training_records = [record for record, out in zip(records, held_out) if not out]
    # The draft vocabulary is the target's own most frequent tokens; dataset answers count only when
    # nothing was regenerated (--modes reference alone).
    own_answers = [record for record, out, is_own in zip(records, held_out, own) if is_own and not out] or training_records
    drafter = SemiARDrafter(config, target, draft_vocab=distill.frequent_tokens(own_answers, args.draft_vocab_size, signature.vocab_size))
    store_dir = work_dir / f"targets-{'-'.join(map(str, layers))}"
    with tqdm(total=len(records), desc="target features", unit="sequence") as bar:
        store = distill.build_target_store(
            target, records, layers, top_k=args.top_k, max_sequence_tokens=args.max_sequence_tokens, directory=store_dir, progress=bar,
        )
    if args.stage == "data":
        return
    train_config = distill.TrainConfig(
        steps=args.steps, learning_rate=args.learning_rate, warmup_steps=args.warmup_steps, sequences_per_step=args.sequences_per_step,
        anchors_per_sequence=args.anchors_per_sequence, weight_decay=args.weight_decay, loss_weights=args.loss_weights, seed=args.seed,
    )
    started = time.perf_counter()
    with tqdm(total=args.steps, desc="training drafter", unit="step") as bar:
        # One checkpoint folder per drafter shape, so a changed configuration never resumes a mismatched run.
        checkpoint = work_dir / f"checkpoint-{hashlib.sha256(config.to_json().encode()).hexdigest()[:10]}"
        # Dataset answers can outnumber the target's own; --own-weight repeats the own ones in the shuffled pool.
        own_training = [sequence for sequence, out, is_own in zip(store, held_out, own) if is_own and not out]
        dataset_training = [sequence for sequence, out, is_own in zip(store, held_out, own) if not is_own and not out]
        training = own_training * args.own_weight + dataset_training
        tqdm.write(f"training pool: {len(training)} draws per pass, {len(own_training)} own answers × {args.own_weight}, {len(dataset_training)} dataset answers")
        validation = [sequence for sequence, out, is_own in zip(store, held_out, own) if out and is_own]
        history = distill.train(drafter, training, train_config, checkpoint_dir=checkpoint, progress=bar, log=tqdm.write, validation=validation)
    drafter.save_pretrained(args.output, dtype=torch.float16)
    print(f"saved to {args.output} after {time.perf_counter() - started:.0f} s; last step: {history[-1] if history else 'resumed at the end'}")


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``dspark`` console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "train" and args.stage != "data" and not args.output:
        parser.error("--output is needed unless --stage data")
    if args.command == "train":
        args.loss_weights = _loss_weights(args.loss_weights, parser)
        if args.own_weight < 1:
            parser.error(f"--own-weight must be a positive integer, got {args.own_weight}")
    if args.command == "generate" and not args.sample and (args.temperature != 1.0 or args.top_p is not None):
        parser.error("--temperature and --top-p need --sample")
    # Loading progress bars would interleave with the streamed answer.
    transformers_logging.disable_progress_bar()
    if args.command == "generate":
        _generate(args)
    elif args.command == "train":
        _train(args)
    elif args.command == "fast-path":
        bundle = pretrained.load(args.model)
        weights = [weight for module in (bundle.target, bundle.drafter) if isinstance(module, torch.nn.Module) for weight in linear_weights(module)]
        print(dspark.wrap(bundle.target, bundle.drafter, fast_path=True).fast_path.describe(weights))
