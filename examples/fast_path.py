"""The CPU fast path on the embedded SmolLM2: greedy prompt lookup equal to HF generate, the linear
formulations chosen for this machine, and what they save on a 1-token and an 8-token step."""

import torch

import dspark
from dspark.cost_models.profiling import measure_step_time
from dspark.fast_path import linear_weights

MAX_NEW_TOKENS = 32  # short, so the example runs in seconds on a CPU (tests/test_examples.py runs it)

bundle = dspark.pretrained.load("smollm2-135m-instruct", drafter="prompt-lookup")  # the shipped drafter is not needed here
tokenizer, target = bundle.tokenizer, bundle.target
message = "Fix the spelling in this sentence: The quik brown fox jumpd over the lazzy dog near the river bank."
text = tokenizer.apply_chat_template([{"role": "user", "content": message}], add_generation_prompt=True, tokenize=False)
batch = tokenizer(text, return_tensors="pt", add_special_tokens=False)

# On a CPU target wrap turns the fast path on by default; it only acts inside dspark's own forwards.
speculative = dspark.wrap(target, dspark.drafters.PromptLookupDrafter())
result = speculative.generate(batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=MAX_NEW_TOKENS)
reference = target.generate(**batch, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
assert torch.equal(result.sequences, reference), "the fast path must not change a single token"
print(tokenizer.decode(result.sequences[0, batch["input_ids"].shape[1] :], skip_special_tokens=True))
print(f"tau {result.stats.tau:.2f}, identical to HF generate")

fast_path = speculative.fast_path
print(fast_path.describe(linear_weights(target)))  # the target's shapes: the cache also holds other models'
print(f"weight copies hold {fast_path.copy_bytes / 2**20:.1f} MiB ({fast_path.reserved_bytes / 2**20:.1f} MiB reserved)")

for tokens in (1, 8):
    plain = measure_step_time(target, rows=1, tokens=tokens, context=300)
    fast = measure_step_time(target, rows=1, tokens=tokens, context=300, fast_path=fast_path)
    print(f"{tokens}-token step after 300 tokens: plain {plain.seconds * 1e3:.1f} ms, fast path {fast.seconds * 1e3:.1f} ms ({plain.seconds / fast.seconds:.2f}x faster)")
