"""The key/value cache dspark keeps: layers that grow in place instead of concatenating.

HF's ``DynamicLayer`` appends each forward's keys and values with ``torch.cat``, copying the whole
layer every step; ``dspark.kv.GrowingLayer`` writes them into spare slots. dspark's loop and drafters
use it for every cache they keep, and any ``transformers`` model accepts it through the public
``cache`` argument, ``model.generate`` included. Tiny random model, so it runs in seconds.
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from dspark.kv import empty_cache

config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                     num_key_value_heads=2, bos_token_id=1, eos_token_id=2, pad_token_id=0)
torch.manual_seed(0)
model = LlamaForCausalLM(config).eval()
prompts = torch.randint(3, 256, (4, 20), generator=torch.Generator().manual_seed(1))
mask = torch.ones_like(prompts)

reference = model.generate(prompts, attention_mask=mask, max_new_tokens=32, do_sample=False)
cache = empty_cache()
grown = model.generate(prompts, attention_mask=mask, max_new_tokens=32, do_sample=False, cache=cache)
print("identical to the default cache:", torch.equal(grown, reference))

layer = cache.layers[0]
print(f"layer 0 holds {layer.get_seq_length()} slots in a buffer of {layer.capacity}: later tokens are written in place")
