"""Greedy speculative decoding on the embedded SmolLM2 with the DSpark drafter shipped for it, checked against HF generate."""

import time

import torch

import dspark

MAX_NEW_TOKENS = 32  # short, so the example runs in seconds on a CPU (tests/test_examples.py runs it)

bundle = dspark.pretrained.load("smollm2-135m-instruct")
tokenizer = bundle.tokenizer
tokenizer.padding_side = "left"
messages = [
    "Rewrite this sentence in the passive voice: The committee approved the new budget.",
    "Write a Python function that reverses a string.",
]
texts = [tokenizer.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True, tokenize=False) for m in messages]
batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)

speculative = dspark.wrap(bundle.target, bundle.drafter)
started = time.perf_counter()
result = speculative.generate(batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=MAX_NEW_TOKENS)
print(f"dspark: {time.perf_counter() - started:.2f} s, tau {result.stats.tau:.2f}")

started = time.perf_counter()
reference = bundle.target.generate(batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
print(f"HF generate: {time.perf_counter() - started:.2f} s, identical: {torch.equal(reference, result.sequences)}")
for row in result.sequences:
    print(tokenizer.decode(row[batch["input_ids"].shape[1] :], skip_special_tokens=True))
