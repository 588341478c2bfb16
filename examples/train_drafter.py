"""Distil a (deliberately small) DSpark drafter for SmolLM2 in about a minute, then generate with it.

The same pipeline as ``dspark train``: the target answers training prompts itself, one target
forward per answer is stored, and the drafter is trained on anchor blocks of those answers with
resumable checkpoints. ``greedy_agreement`` then scores it on the target's own answer without timing
anything: what greedy verification accepts, anchor by anchor. A real drafter trains for thousands of
steps on thousands of answers (see docs/training.rst); this one is just big enough to show every stage.
"""

import tempfile
from pathlib import Path

import torch

import dspark
from dspark.drafters import SemiARConfig
from dspark.pretrained import encode_chat, load_target
from dspark.training import DataConfig, TargetPass, TrainConfig, distill_drafter, greedy_agreement

# The project's prompt sets beside this checkout; elsewhere pass your own folder holding train/.
DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"

target, tokenizer = load_target("smollm2-135m-instruct")
config = SemiARConfig.for_target(target, num_layers=1, intermediate_size=256, rank=16, draft_vocab_size=2048)
data = DataConfig(prompts=8, max_new_tokens=48, modes=("greedy", "reference"))
steps = TrainConfig(steps=30, learning_rate=1e-3, warmup_steps=5, sequences_per_step=2, anchors_per_sequence=8)
with tempfile.TemporaryDirectory() as work_dir:
    drafter = distill_drafter(target, tokenizer, config, work_dir, data, steps, data_dir=DATA_DIR, progress=False)
    drafter.save_pretrained(f"{work_dir}/drafter", dtype=torch.float16)  # what --output writes

batch = encode_chat(tokenizer, ["Give three tips for staying healthy."])
result = dspark.wrap(target, drafter).generate(**batch, max_new_tokens=32)
reference = target.generate(**batch, max_new_tokens=32, do_sample=False)
print(tokenizer.decode(result.sequences[0, batch["input_ids"].shape[1] :], skip_special_tokens=True))
print(f"tau {result.stats.tau:.2f} after 30 steps; identical to model.generate: {torch.equal(result.sequences, reference)}")
# Generation's walk over the target's own text: the loop's tau had every drafted position been verified.
walked = greedy_agreement(drafter, TargetPass.of(target, reference[0]), prompt_length=batch["input_ids"].shape[1], anchors="walk")
print(f"teacher-forced on that answer: first position agrees {walked.first_rate:.2f} of {walked.blocks} blocks, tau {walked.tau:.2f}")
