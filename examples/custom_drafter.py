"""A drafter of your own, in about twenty lines: draft from a reference document (retrieval-style,
as when a model edits or quotes a text it was given), keeping a per-row hit count through the
drafter lifecycle (start, propose, observe)."""

import torch

import dspark
from dspark.drafters.prompt_lookup import lookup_continuation
from dspark.pretrained import encode_chat


class DocumentDrafter:
    """Proposes what followed the latest match of the row's last two tokens in ``document``."""

    vocab_size = None  # it copies token ids, so any vocabulary fits

    def __init__(self, document: torch.Tensor):
        self.document = document

    def start(self, start):  # optional hook: a new generation of start.rows rows
        self.accepted = torch.zeros(start.rows, dtype=torch.long)

    def propose(self, context, max_draft_tokens):
        tokens = torch.zeros((context.rows.numel(), max_draft_tokens), dtype=torch.long)
        lengths = torch.zeros(context.rows.numel(), dtype=torch.long)
        for index, (begin, end) in enumerate(zip(context.begin.tolist(), context.end.tolist())):
            tail = context.tokens[index, max(begin, end - 2) : end]
            found = lookup_continuation(torch.cat([self.document, tail]), 2, 2, max_draft_tokens)
            tokens[index, : found.numel()], lengths[index] = found, found.numel()
        return dspark.Draft(tokens=tokens, lengths=lengths)

    def observe(self, outcome):  # outcome.rows index the batch given to start
        self.accepted[outcome.rows] += outcome.accepted.cpu()


bundle = dspark.pretrained.load("smollm2-135m-instruct", drafter="prompt-lookup")
text = "The quick brown fox jumps over the lazy dog. The dog sleeps in the warm afternoon sun by the river."
batch = encode_chat(bundle.tokenizer, [f"Repeat this text exactly, then stop: {text}"])
drafter = DocumentDrafter(bundle.tokenizer(text, return_tensors="pt")["input_ids"][0])
result = dspark.wrap(bundle.target, drafter).generate(**batch, max_new_tokens=40)
assert torch.equal(result.sequences, bundle.target.generate(**batch, max_new_tokens=40, do_sample=False))
print(bundle.tokenizer.decode(result.sequences[0, batch["input_ids"].shape[1] :], skip_special_tokens=True))
print(f"tau {result.stats.tau:.2f}; draft tokens accepted per row: {drafter.accepted.tolist()}")
