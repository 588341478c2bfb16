"""A left-padded batch of chat prompts with prompt lookup on the embedded SmolLM2: rows of different
lengths finish at different steps, and res.stats tells how speculation went for the whole batch."""

import torch

import dspark
from dspark.pretrained import encode_chat
from dspark.drafters import PromptLookupDrafter

bundle = dspark.pretrained.load("smollm2-135m-instruct", drafter="prompt-lookup")
tokenizer, target = bundle.tokenizer, bundle.target
batch = encode_chat(tokenizer, [
    "List three prime numbers and say why each is prime.",
    "Repeat this sentence twice: the cat sat on the mat.",
    "What is the capital of Italy?",
])

result = dspark.wrap(target, PromptLookupDrafter()).generate(**batch, max_new_tokens=40)
assert torch.equal(result.sequences, target.generate(**batch, max_new_tokens=40, do_sample=False))
for row in result.sequences[:, batch["input_ids"].shape[1] :]:
    print("-", tokenizer.decode(row, skip_special_tokens=True).strip())

stats = result.stats
row_steps = sum(record.rows.numel() for record in stats.records)
print(f"{stats.steps} target forwards ({row_steps} row-steps) for {stats.new_tokens} new tokens: tau {stats.tau:.2f} per row-step")
print("acceptance per draft position:", [round(rate, 2) for rate in stats.position_acceptance.tolist()])
print(f"{len(stats.verified)} draft tokens verified, {sum(token.accepted for token in stats.verified)} accepted")
print(f"drafting {1000 * stats.draft_seconds:.0f} ms, verifying {1000 * stats.verify_seconds:.0f} ms")
