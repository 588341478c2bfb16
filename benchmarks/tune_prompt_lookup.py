"""Choose PromptLookupDrafter's defaults on *training* prompts (never eval/): a sweep over the block
width γ and the shortest n-gram that may trigger a draft, greedy, batch 1, SmolLM2.

For each setting it records τ, the share of steps that verified something, and the measured
target-forward times of plain (ℓ = 0) and verifying (ℓ ≥ 1) steps; the speed it reports is
tokens / wall-clock seconds, next to an autoregressive run of the same prompts in the same process.

    python benchmarks/tune_prompt_lookup.py --prompts 12 --max-new-tokens 96
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from transformers.utils import logging as transformers_logging

from dspark import pretrained, strategies
from dspark.benchmarking import sweep
from dspark.drafters import PromptLookupDrafter
from dspark.training.data import training_prompts

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "benchmarks" / "results" / "tune_prompt_lookup.json"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--data-dir", default=None, help="the prompt-data folder holding train/ (default: dspark.training.default_data_dir())")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--gammas", default="2,4,6")
    parser.add_argument("--min-ngrams", default="1,2")
    args = parser.parse_args(argv)
    transformers_logging.disable_progress_bar()
    bundle = pretrained.load()
    tokenizer = bundle.tokenizer
    prompts = [
        dict(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt", return_dict=True))
        for text in (prompt.text for prompt in training_prompts(args.data_dir, "calibration", limit=args.prompts))
    ]
    settings = [("autoregressive", strategies.autoregressive(PromptLookupDrafter()))]
    for min_ngram in map(int, args.min_ngrams.split(",")):
        for gamma in map(int, args.gammas.split(",")):
            drafter = PromptLookupDrafter(max_ngram=max(3, min_ngram), min_ngram=min_ngram)
            settings.append((f"min_ngram={min_ngram},gamma={gamma}", strategies.fixed_length(drafter, gamma)))
    results = sweep(bundle.target, settings, prompts, args.max_new_tokens)
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps({"command": shlex.join([sys.executable, *sys.argv]), "settings": vars(args), "results": results}, indent=2))
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
