"""Teacher-forced greedy agreement in dspark/training/agreement.py."""

import pytest
import torch

import dspark
from dspark.training.agreement import Agreement, TargetPass, agreeing_prefixes, greedy_agreement
from dspark.verify import FixedLength
from tests.conftest import build_model, left_padded_batch, tiny_semi_ar_drafter


@pytest.mark.parametrize("anchor_input", ["embedding", "feature"])
def test_prefixes_equal_what_the_loop_accepts_at_its_anchors(anchor_input):
    """On the target's greedy text, n_a at each anchor the loop drafts from is the count it accepts there (every position verified)."""
    target = build_model("llama", vocab_size=12)
    drafter = tiny_semi_ar_drafter(target, max_draft_tokens=3, anchor_input=anchor_input)
    input_ids, attention_mask = left_padded_batch([7], vocab_size=12)
    text = target.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=40, do_sample=False, eos_token_id=None)[0]
    prefixes = agreeing_prefixes(drafter, TargetPass.of(target, text), prompt_length=7)
    assert prefixes.shape == (text.numel() - 3 - 6,)
    result = dspark.wrap(target, drafter, policy=FixedLength(3)).generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=40, eos_token_id=[])
    assert torch.equal(result.sequences[0], text)
    anchor, compared = 6, 0
    for record in result.stats.records:
        if anchor - 6 < prefixes.numel() and int(record.verify_lengths[0]) == 3:
            assert int(record.accepted[0]) == int(prefixes[anchor - 6]), f"anchor {anchor}"
            compared += 1
        anchor += int(record.accepted[0]) + 1
    assert compared >= 5 and int(prefixes.sum()) > 0, "the check must cover several anchors and some agreement"


def test_agreement_counts_rates_and_sums():
    """first_rate and tau follow the counts; Agreements add; an empty one reads 0 and 1; impossible counts are refused."""
    agreement = Agreement(blocks=4, first=2, accepted=5) + Agreement(blocks=1, first=1, accepted=1)
    assert agreement == Agreement(5, 3, 6) and agreement.first_rate == pytest.approx(0.6) and agreement.tau == pytest.approx(2.2)
    assert Agreement().first_rate == 0.0 and Agreement().tau == 1.0
    with pytest.raises(ValueError, match="first must be at most"):
        Agreement(blocks=1, first=2, accepted=2)


def test_sequences_too_short_for_a_block_and_bad_arguments():
    """No anchor fits: an empty Agreement; a batch, or a prompt length outside the tokens, is refused."""
    target = build_model("llama", vocab_size=12)
    drafter = tiny_semi_ar_drafter(target, max_draft_tokens=3)
    short = TargetPass.of(target, torch.tensor([3, 4, 5]))
    assert greedy_agreement(drafter, short, prompt_length=2) == Agreement()
    with pytest.raises(ValueError, match="one sequence"):
        TargetPass.of(target, torch.tensor([[3, 4, 5]]))
    with pytest.raises(ValueError, match="prompt_length"):
        greedy_agreement(drafter, short, prompt_length=4)
