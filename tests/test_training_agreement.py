"""Teacher-forced greedy agreement in dspark/training/agreement.py."""

import pytest
import torch

import dspark
from dspark.training.agreement import Agreement, TargetPass, agreeing_prefixes, greedy_agreement, walk
from dspark.verify import FixedLength
from tests.conftest import build_model, left_padded_batch, tiny_semi_ar_drafter


@pytest.mark.parametrize("anchor_input", ["embedding", "feature"])
def test_prefixes_equal_what_the_loop_accepts_at_its_anchors(anchor_input):
    """On the target's greedy text, n_a at each anchor the loop drafts from is the count it accepts there, and those anchors are the walk."""
    target = build_model("llama", vocab_size=12)
    drafter = tiny_semi_ar_drafter(target, max_draft_tokens=3, anchor_input=anchor_input)
    input_ids, attention_mask = left_padded_batch([7], vocab_size=12)
    text = target.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=40, do_sample=False, eos_token_id=None)[0]
    prefixes = agreeing_prefixes(drafter, TargetPass.of(target, text), prompt_length=7)
    assert prefixes.shape == (text.numel() - 3 - 6,)
    result = dspark.wrap(target, drafter, policy=FixedLength(3)).generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=40, eos_token_id=[])
    assert torch.equal(result.sequences[0], text)
    anchor, visited = 6, []
    for record in result.stats.records:
        if anchor - 6 < prefixes.numel():
            # The last anchor's block is cut to what the 40-token budget leaves after a bonus token.
            verified = int(record.verify_lengths[0])
            assert verified == min(3, text.numel() - 2 - anchor), f"anchor {anchor}"
            assert int(record.accepted[0]) == min(int(prefixes[anchor - 6]), verified), f"anchor {anchor}"
            visited.append(anchor - 6)
        anchor += int(record.accepted[0]) + 1
    assert len(visited) >= 5 and int(prefixes.sum()) > 0, "the check must cover several anchors and some agreement"
    assert walk(prefixes).tolist() == visited
    walked = greedy_agreement(drafter, TargetPass.of(target, text), prompt_length=7, anchors="walk")
    assert walked.blocks == len(visited) and walked.accepted == sum(int(prefixes[index]) for index in visited)


def test_walk_steps_past_each_accepted_prefix():
    """The walk visits 0, then i + n_i + 1 while inside the anchors; an unknown anchor set is refused."""
    assert walk(torch.tensor([2, 0, 0, 1, 0, 3, 0])).tolist() == [0, 3, 5]
    assert walk(torch.tensor([0, 0])).tolist() == [0, 1] and walk(torch.zeros(0, dtype=torch.long)).tolist() == []
    target = build_model("llama", vocab_size=12)
    with pytest.raises(ValueError, match="anchors must be one of"):
        greedy_agreement(tiny_semi_ar_drafter(target, max_draft_tokens=3), TargetPass.of(target, torch.arange(3, 11)), prompt_length=2, anchors="every")


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
