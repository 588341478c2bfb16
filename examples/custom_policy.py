"""A verify policy of your own, in about twenty lines: check the longest draft prefix whose prefix
survival a_k = c_1·…·c_k stays above a floor, with the shipped DSpark drafter's confidence head."""

import attrs
import torch

import dspark
from dspark.pretrained import encode_chat
from dspark.verify import DrafterConfidence


@attrs.frozen
class PrefixSurvivalFloor:
    """Verify x_1..x_ℓ for the largest ℓ with a_ℓ ≥ floor (a VerifyPolicy: one method, `lengths`)."""

    floor: float = attrs.field(validator=attrs.validators.and_(attrs.validators.ge(0.0), attrs.validators.le(1.0)))
    needs_survival = True  # wrap refuses to run it without a confidence estimator

    def lengths(self, survival, cost_model, limits):
        # survival[r, k] = c_k, known before x_k was drawn, so the choice stays lossless under sampling.
        prefix_survival = survival.cumprod(dim=-1)
        return torch.minimum((prefix_survival >= self.floor).long().cumprod(dim=-1).sum(dim=-1), limits)


bundle = dspark.pretrained.load("smollm2-135m-instruct")  # .drafter: the shipped SemiARDrafter
batch = encode_chat(bundle.tokenizer, ["Write a Python function that returns the squares of a list of numbers."])
model = dspark.wrap(bundle.target, bundle.drafter, policy=PrefixSurvivalFloor(0.3), confidence=DrafterConfidence())
result = model.generate(**batch, max_new_tokens=32)
assert torch.equal(result.sequences, bundle.target.generate(**batch, max_new_tokens=32, do_sample=False))
lengths = [int(length) for record in result.stats.records for length in record.verify_lengths]
print(f"tau {result.stats.tau:.2f}; verify lengths per step: {lengths}")
print(bundle.tokenizer.decode(result.sequences[0, batch["input_ids"].shape[1] :], skip_special_tokens=True))
