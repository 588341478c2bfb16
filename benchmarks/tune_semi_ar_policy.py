"""Choose a trained SemiARDrafter's default verify rule on held-out *calibration* prompts (never eval/).

Greedy, batch 1, SmolLM2: plain decoding, then a Threshold on the confidence head's survival
Π c_j for each candidate t (t = 0 verifies all γ drafted tokens), and, for a calibrated drafter,
the DSpark preset (its calibrated estimator, ``HardwareAwareScheduler``, ``profiled_cost_model``).
The fastest setting is reported and, with ``--write``, stored in the drafter's config.json as what
``dspark.wrap(target, drafter)`` then uses: ``verify_threshold`` t, or none for the DSpark preset
(a calibrated drafter without a threshold gets the preset; an uncalibrated one verifies everything).

    python benchmarks/tune_semi_ar_policy.py --drafter DIR --write
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import attrs
from transformers.utils import logging as transformers_logging

import dspark
from dspark import pretrained, strategies
from dspark.benchmarking import sweep, write_json
from dspark.drafters import PromptLookupDrafter, SemiARDrafter
from dspark.training.data import training_prompts
from dspark.verify import DrafterConfidence, HardwareAwareScheduler, Threshold, calibrated_estimator

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "benchmarks" / "results" / "tune_semi_ar_policy.json"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", type=Path, required=True, help="a SemiARDrafter.save_pretrained directory")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--data-dir", default=None, help="the prompt-data folder holding train/ (default: dspark.training.default_data_dir())")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--thresholds", default="0,0.05,0.1,0.2,0.3,0.5")
    parser.add_argument("--write", action="store_true", help="store the fastest threshold in the drafter's config.json")
    args = parser.parse_args(argv)
    transformers_logging.disable_progress_bar()
    bundle = pretrained.load()
    drafter = SemiARDrafter.from_pretrained(args.drafter, target=bundle.target)
    prompts = [
        dict(bundle.tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}], add_generation_prompt=True, return_tensors="pt", return_dict=True))
        for prompt in training_prompts(args.data_dir, "calibration", limit=args.prompts)
    ]
    gamma = drafter.config.max_draft_tokens
    settings = [("autoregressive", strategies.autoregressive(PromptLookupDrafter()))]
    for threshold in map(float, args.thresholds.split(",")):
        settings.append((f"threshold={threshold}", dspark.Strategy(drafter=drafter, policy=Threshold(threshold), confidence=DrafterConfidence(), max_draft_tokens=gamma)))
    if drafter.calibration is not None:
        settings.append(("dspark", dspark.Strategy(
            drafter=drafter, policy=HardwareAwareScheduler(max_draft_tokens=gamma), confidence=calibrated_estimator(drafter.calibration),
            max_draft_tokens=gamma, cost_model=dspark.profiled_cost_model(bundle.target, drafter, gamma),
        )))
    results = sweep(bundle.target, settings, prompts, args.max_new_tokens)
    best = max((name for name in results if name != "autoregressive"), key=lambda name: results[name]["tokens_per_s"])
    chosen = None if best == "dspark" else float(best.split("=")[1])
    report = {"command": shlex.join([sys.executable, *sys.argv]), "settings": {**vars(args), "drafter": str(args.drafter)}, "results": results, "chosen_threshold": chosen}
    write_json(OUTPUT, report)
    print(f"fastest: {best}; wrote {OUTPUT}")
    if args.write:
        config = attrs.evolve(drafter.config, verify_threshold=None if chosen in (None, 0.0) else chosen)
        (args.drafter / "config.json").write_text(config.to_json())
        print(f"stored verify_threshold={config.verify_threshold} in {args.drafter / 'config.json'}")
    return report


if __name__ == "__main__":
    main()
