"""End-to-end sanity probe of distillation on SmolLM2: train a γ=7 Markov drafter for a few hundred
steps on the answers regenerated so far, then measure τ, per-position acceptance and drafting vs
verifying time on held-out *calibration* prompts (never eval/).

    python benchmarks/probe_distill.py --steps 300 --prompts 8
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from tqdm import tqdm

import dspark
from dspark import pretrained
from dspark.drafters import SemiARConfig, SemiARDrafter, TargetSignature, distill
from dspark.verify import FixedLength

TRAIN = Path(__file__).resolve().parents[2] / "shared" / "data" / "train"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=pretrained.default_cache_dir() / "distill" / "smollm2-135m-instruct" / "data.jsonl")
    parser.add_argument("--work-dir", type=Path, default=pretrained.default_cache_dir() / "distill" / "probe")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    bundle = pretrained.load()
    target = bundle.target
    records = distill.read_sequences(args.data)
    print(f"{len(records)} sequences, {sum(len(r['response_ids']) for r in records)} response tokens")
    config = SemiARConfig(
        target=TargetSignature.of(target), target_layers=distill.default_target_layers(target.config.num_hidden_layers),
        block_size=7, num_heads=target.config.num_attention_heads, intermediate_size=1024, rank=64, draft_vocab_size=8192,
    )
    torch.manual_seed(0)
    drafter = SemiARDrafter(config, target, draft_vocab=distill.frequent_tokens(records, 8192, config.target.vocab_size))
    train_config = distill.TrainConfig(steps=args.steps, learning_rate=1e-3, warmup_steps=20, sequences_per_step=4, anchors_per_sequence=16)
    with tqdm(total=args.steps, desc="training", mininterval=30) as bar:
        history = distill.train(drafter, target, records, train_config, checkpoint_dir=args.work_dir / "checkpoint", progress=bar, log=print)
    for entry in history[:: max(1, len(history) // 6)] + history[-1:]:
        print({key: round(value, 4) for key, value in entry.items()})
    drafter.save_pretrained(args.work_dir / "drafter", dtype=torch.float16)
    speculative = dspark.wrap(target, drafter, policy=FixedLength(7))
    taus, reached, accepted, draft_seconds, verify_seconds, steps = [], torch.zeros(7), torch.zeros(7), 0.0, 0.0, 0
    for prompt in distill.training_prompts(TRAIN, "calibration", limit=args.prompts):
        encoded = bundle.tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
        if encoded["input_ids"].shape[1] > 512:
            continue
        stats = speculative.generate(encoded["input_ids"], attention_mask=encoded["attention_mask"], max_new_tokens=args.max_new_tokens).stats
        counts = stats.position_counts()
        taus.append(stats.tau)
        reached, accepted = reached + counts[0], accepted + counts[1]
        draft_seconds, verify_seconds, steps = draft_seconds + stats.draft_seconds, verify_seconds + stats.verify_seconds, steps + stats.steps
    print(f"calibration prompts: mean τ {sum(taus) / len(taus):.2f}; per-position acceptance {(accepted / reached.clamp_min(1)).tolist()}")
    print(f"drafting {1000 * draft_seconds / steps:.1f} ms/step, verifying {1000 * verify_seconds / steps:.1f} ms/step")


if __name__ == "__main__":
    main()
