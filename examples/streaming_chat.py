"""One chat turn streamed token by token as the target accepts them, the way `dspark generate` does:
a transformers TextStreamer receives each step's emitted tokens."""

import torch
from transformers import TextStreamer

import dspark
from dspark.pretrained import encode_chat

bundle = dspark.pretrained.load("smollm2-135m-instruct")
prompt = encode_chat(bundle.tokenizer, ["Give me two tips for writing clear emails."])
streamer = TextStreamer(bundle.tokenizer, skip_prompt=True, skip_special_tokens=True)  # needs batch size 1

result = dspark.wrap(bundle.target, bundle.drafter).generate(
    **prompt, max_new_tokens=48, do_sample=True, temperature=0.7, top_p=0.9,
    generator=torch.Generator().manual_seed(0), streamer=streamer,
)
print(f"\n[{result.stats.new_tokens} tokens in {result.stats.steps} target forwards, tau {result.stats.tau:.2f}]")
