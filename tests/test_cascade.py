"""CascadeDrafter: per row one part's draft, chosen without reading the drawn tokens; greedy output equals
HF generate, the parts draft only their rows, and bad compositions are refused."""

import pytest
import torch

import dspark
from dspark.drafters import CascadeDrafter, DraftModelDrafter, PromptLookupDrafter
from dspark.verify import DrafterConfidence, DraftProbability, FixedLength
from tests.conftest import FixedSurvival, build_model, left_padded_batch, start_generation, tiny_semi_ar_drafter


class AskedRecorder:
    """Wraps a drafter and records, per propose, which batch rows it was asked to draft for."""

    def __init__(self, drafter):
        self.drafter, self.asked = drafter, []
        self.vocab_size = drafter.vocab_size
        self.target_layers = dspark.protocols.hook(drafter, "target_layers", dspark.protocols.DRAFTER_HOOKS)
        self.max_draft_tokens = dspark.protocols.hook(drafter, "max_draft_tokens", dspark.protocols.DRAFTER_HOOKS)

    def start(self, start):
        begin = dspark.protocols.hook(self.drafter, "start", dspark.protocols.DRAFTER_HOOKS)
        if begin is not None:
            begin(start)

    def propose(self, context, max_draft_tokens):
        wanted = context.rows if context.draft_rows is None else context.rows[context.draft_rows]
        self.asked.append(set(wanted.tolist()) if max_draft_tokens > 0 else set())
        return self.drafter.propose(context, max_draft_tokens)

    def observe(self, outcome):
        self.drafter.observe(outcome)


def repetitive_batch():
    """Rows 0 and 2 repeat themselves (lookup finds matches), rows 1 and 3 are random."""
    input_ids, attention_mask = left_padded_batch([9, 12, 8, 10], seed=6)
    input_ids[0, -6:] = torch.tensor([11, 12, 13, 11, 12, 13])
    input_ids[2, -6:] = torch.tensor([21, 22, 23, 21, 22, 23])
    return input_ids, attention_mask


@pytest.mark.parametrize("rule", ["first", "confidence"])
@pytest.mark.parametrize("second", ["semi-ar", "draft-model"])
def test_greedy_output_equals_hf_generate(llama, rule, second):
    """Lookup plus a learnt or small-model drafter, either rule, the default scheduler or every position: HF greedy output."""
    input_ids, attention_mask = repetitive_batch()
    expected = llama.generate(input_ids, attention_mask=attention_mask, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    other = (tiny_semi_ar_drafter(llama), DrafterConfidence()) if second == "semi-ar" else (DraftModelDrafter(build_model("llama", seed=1)), DraftProbability())
    cascade = CascadeDrafter([(PromptLookupDrafter(max_ngram=3, min_ngram=2), FixedSurvival()), other], rule=rule)
    for policy in (None, FixedLength(4)):
        result = dspark.wrap(llama, cascade, policy=policy, cost_model=dspark.cost_models.ConstantCostModel()).generate(
            input_ids, attention_mask=attention_mask, max_new_tokens=24, eos_token_id=[]
        )
        assert torch.equal(result.sequences, expected), policy


def test_under_the_first_rule_the_second_part_drafts_only_unclaimed_rows(llama):
    """Rows where lookup found a match are not asked of the semi-AR drafter; it drafts the others."""
    input_ids, attention_mask = repetitive_batch()
    lookup, learnt = AskedRecorder(PromptLookupDrafter(max_ngram=3, min_ngram=3)), AskedRecorder(tiny_semi_ar_drafter(llama))
    cascade = CascadeDrafter([(lookup, FixedSurvival()), (learnt, DrafterConfidence())], rule="first")
    dspark.wrap(llama, cascade, policy=FixedLength(4)).generate(input_ids, attention_mask=attention_mask, max_new_tokens=8, eos_token_id=[])
    first_lookup, first_learnt = lookup.asked[0], learnt.asked[0]
    assert first_lookup == {0, 1, 2, 3}
    assert {0, 2}.isdisjoint(first_learnt) and {1, 3} <= first_learnt


def _context(llama, input_ids, attention_mask):
    """The first DraftContext of a generation, with the prompt's target features (layers 1 and 2)."""
    with torch.inference_mode():
        hidden = llama(input_ids[:, :-1], attention_mask=attention_mask[:, :-1], output_hidden_states=True).hidden_states
    return dspark.DraftContext(
        tokens=input_ids, begin=(attention_mask == 0).sum(dim=1), end=torch.full((input_ids.shape[0],), input_ids.shape[1]),
        rows=torch.arange(input_ids.shape[0]), step=0, sampling=dspark.SamplingConfig(),
        features=torch.cat([hidden[1], hidden[2]], dim=-1), feature_mask=attention_mask[:, :-1],
    )


def test_the_confidence_rule_keeps_the_part_with_the_higher_first_survival(llama):
    """With lookup's survival above the learnt drafter's, rows with a match keep lookup's draft; below, the learnt one's;
    rows without a match always keep the learnt drafter's. The kept survival travels in Draft.confidence."""
    input_ids, attention_mask = repetitive_batch()
    for value in (0.999, 0.001):
        cascade = CascadeDrafter([(PromptLookupDrafter(max_ngram=3, min_ngram=3), FixedSurvival(value)), (tiny_semi_ar_drafter(llama), DrafterConfidence())], rule="confidence")
        start_generation(cascade, rows=4)
        draft = cascade.propose(_context(llama, input_ids, attention_mask), 4)
        from_lookup = torch.isclose(draft.confidence[:, 0], torch.tensor(value))
        assert from_lookup.tolist() == ([True, False, True, False] if value > 0.5 else [False] * 4)
        assert cascade.sources.tolist() == ([0, 1, 0, 1] if value > 0.5 else [1] * 4)
        if value > 0.5:
            assert draft.tokens[0, :3].tolist() == [11, 12, 13] and draft.probs[0, 0, 11] == 1.0


def test_bad_compositions_are_refused(llama):
    """Fewer than two parts, a part that is not a (drafter, estimator) pair, an unknown rule, disagreeing parts."""
    lookup = (PromptLookupDrafter(), FixedSurvival())
    with pytest.raises(ValueError, match="at least two"):
        CascadeDrafter([lookup])
    with pytest.raises(TypeError, match=r"parts\[1\]"):
        CascadeDrafter([lookup, PromptLookupDrafter()])
    with pytest.raises(ValueError, match="rule must be one of"):
        CascadeDrafter([lookup, lookup], rule="best")
    with pytest.raises(ValueError, match="claim_survival"):
        CascadeDrafter([lookup, lookup], claim_survival=1.5)
    other_vocab = DraftModelDrafter(build_model("llama", seed=1, vocab_size=64))
    with pytest.raises(ValueError, match="vocab_size must agree"):
        CascadeDrafter([(tiny_semi_ar_drafter(llama), DrafterConfidence()), (other_vocab, DraftProbability())])
