"""Prompt lookup under the DSpark preset with a confidence estimator that keeps learning: the logistic model of
lookup's signals, fitted offline on training prompts, is refitted on the outcomes of the steps it scored, one
model per sampling band. Lookup's signals (the matched n-gram, its age, how often it recurs) transfer poorly from
the prompts a calibration saw to the prompts served, and a scheduler verifying what an overconfident estimator
rates well pays for wide forwards that accept little.
"""

from pathlib import Path

import torch

import dspark
from dspark.drafters import PromptLookupDrafter
from dspark.pretrained import encode_chat
from dspark.verify import CalibrationFile, online_estimator

bundle = dspark.pretrained.load("smollm2-135m-instruct")
lookup_calibration = CalibrationFile.load(Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "calibration_prompt_lookup")
drafter = PromptLookupDrafter()
# Refit every 5 scored steps here, so that this short run shows refits; the default is every 100.
estimator = online_estimator(lookup_calibration, refit_every=5, min_samples=5)
cost_model = dspark.profiled_cost_model(bundle.target, drafter, drafter.max_draft_tokens)
model = dspark.SpeculativeModel(bundle.target, dspark.strategies.dspark(drafter, drafter.max_draft_tokens, cost_model, estimator))

text = "The committee met on Tuesday, reviewed the budget line by line, and approved the new library wing."
batch = encode_chat(bundle.tokenizer, [f"Repeat this sentence three times, word for word: {text}"])
for attempt in range(2):
    result = model.generate(**batch, max_new_tokens=64)
    assert torch.equal(result.sequences, bundle.target.generate(**batch, max_new_tokens=64, do_sample=False))
    print(f"greedy run {attempt + 1}: tau {result.stats.tau:.2f}, greedy refits so far {estimator.estimators['greedy'].refits}")

sampled = model.generate(**batch, max_new_tokens=64, do_sample=True, temperature=1.0, generator=torch.Generator().manual_seed(0))
print(f"sampled run: tau {sampled.stats.tau:.2f}; the bands with an estimator of their own: {sorted(estimator.estimators)}")
print(bundle.tokenizer.decode(result.sequences[0, batch["input_ids"].shape[1] :], skip_special_tokens=True))
