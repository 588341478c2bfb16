"""Compose drafters: prompt lookup where the context repeats itself, the shipped semi-autoregressive
drafter elsewhere, each with the confidence estimator calibrated for it. Per row and step one part's
draft is kept, so copying rows cost almost nothing to draft and the others still get a learnt draft.
"""

from pathlib import Path

import torch

import dspark
from dspark.drafters import CascadeDrafter, PromptLookupDrafter
from dspark.pretrained import encode_chat
from dspark.verify import CalibrationFile, calibrated_estimator

bundle = dspark.pretrained.load("smollm2-135m-instruct")
# Prompt lookup's calibration for this target: `dspark calibrate --drafter prompt-lookup --output DIR`.
lookup_calibration = CalibrationFile.load(Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "calibration_prompt_lookup")
cascade = CascadeDrafter([
    (PromptLookupDrafter(), calibrated_estimator(lookup_calibration)),
    (bundle.drafter, calibrated_estimator(bundle.drafter.calibration)),
])
text = "The quick brown fox jumps over the lazy dog near the river bank."
batch = encode_chat(bundle.tokenizer, [f"Repeat this sentence twice: {text}", "Name three primary colours."])
# wrap's defaults for a cascade: each row's own part's survival, the hardware-aware scheduler, a profiled cost model.
result = dspark.wrap(bundle.target, cascade).generate(**batch, max_new_tokens=32)
assert torch.equal(result.sequences, bundle.target.generate(**batch, max_new_tokens=32, do_sample=False))
for row in range(2):
    print(bundle.tokenizer.decode(result.sequences[row, batch["input_ids"].shape[1] :], skip_special_tokens=True))
print(f"tau {result.stats.tau:.2f}")
