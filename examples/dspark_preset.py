"""Profile what a target forward costs on this machine, then generate with the DSpark preset: the
hardware-aware prefix scheduler (paper Algorithm 1) verifies only the draft tokens whose expected
acceptance pays for their place in the forward. A larger batch of longer prompts gets a table of its
own shape, profiled the first time. Tiny random models, so it runs in seconds.
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import dspark
from dspark.drafters import DraftModelDrafter

config = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3, bos_token_id=1, eos_token_id=2, pad_token_id=0)
torch.manual_seed(0)
target = LlamaForCausalLM(LlamaConfig(num_hidden_layers=4, **config)).eval()
# Its first two layers with its own head stand in for a trained drafter: its guesses are often right.
small = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, **config)).eval()
small.load_state_dict(target.state_dict(), strict=False)
drafter = DraftModelDrafter(small)

# Measured once per machine, model and drafter, then read from the cache; corrected online by every step.
cost_model = dspark.profiled_cost_model(target, drafter, max_draft_tokens=4)
print(f"one forward: 1 row x 1 token {1000 * cost_model.step_time(1, 1):.2f} ms, 8 rows x 5 tokens {1000 * cost_model.step_time(8, 5):.2f} ms")

strategy = dspark.strategies.dspark(drafter, max_draft_tokens=4, cost_model=cost_model)
prompts = torch.randint(3, 256, (4, 12), generator=torch.Generator().manual_seed(1))
result = dspark.SpeculativeModel(target, strategy).generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=24)
reference = target.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=24, do_sample=False)
verified = [record.verify_lengths.tolist() for record in result.stats.records[:4]]
print(f"verify lengths of the first steps: {verified}; tau {result.stats.tau:.2f}")
print("identical to model.generate:", torch.equal(result.sequences, reference))

# 12 rows of 300-token prompts: the cost model switches to a table over 1-16 rows at a 362-token context.
long_prompts = torch.randint(3, 256, (12, 300), generator=torch.Generator().manual_seed(2))
before = cost_model.step_time(12, 2)
result = dspark.SpeculativeModel(target, strategy).generate(long_prompts, attention_mask=torch.ones_like(long_prompts), max_new_tokens=16)
rows, context = cost_model.base.current_shape
print(f"table for this batch: rows {list(rows)}, context {context}; 12 rows x 2 tokens {1000 * before:.2f} ms before, "
      f"{1000 * cost_model.step_time(12, 2):.2f} ms now")
