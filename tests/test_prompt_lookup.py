"""The n-gram drafter in dspark/drafters/prompt_lookup.py."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dspark.drafters import PromptLookupDrafter, lookup_continuation
from dspark.drafters.prompt_lookup import lookup_match
from dspark.types import DraftContext, SamplingConfig
from tests.strategies import ragged_token_rows


def test_lookup_takes_the_latest_match_of_the_longest_ngram():
    """The last trigram's latest earlier occurrence decides the continuation."""
    context = torch.tensor([1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3])
    assert lookup_continuation(context, max_ngram=3, min_ngram=1, max_draft_tokens=3).tolist() == [7, 8, 5]


def oracle_lookup(tokens: list[int], max_ngram: int, min_ngram: int, max_draft_tokens: int):
    """Prompt lookup spelt out in plain Python: (continuation, n, age, occurrences) or None."""
    for n in range(max_ngram, min_ngram - 1, -1):
        if n >= len(tokens):
            continue
        starts = [p for p in range(len(tokens) - n) if tokens[p : p + n] == tokens[len(tokens) - n :]]
        if starts:
            begin = starts[-1] + n
            return tokens[begin : begin + max_draft_tokens], n, len(tokens) - begin, len(starts)
    return None


@given(st.lists(st.integers(0, 5), max_size=40), st.integers(1, 4), st.integers(1, 4), st.integers(1, 6))
def test_lookup_match_equals_the_plain_python_lookup(tokens, max_ngram, min_ngram, max_draft_tokens):
    """lookup_match finds the same continuation, n, age and occurrences as the plain-Python oracle."""
    min_ngram = min(min_ngram, max_ngram)
    match = lookup_match(torch.tensor(tokens, dtype=torch.long), max_ngram, min_ngram, max_draft_tokens)
    found = None if match is None else (match.continuation.tolist(), match.ngram, match.age, match.occurrences)
    assert found == oracle_lookup(tokens, max_ngram, min_ngram, max_draft_tokens)


def test_propose_handles_ragged_rows():
    """Rows without a match get length 0; the others get their own continuation."""
    tokens = torch.tensor([[0, 0, 4, 5, 6, 4, 5], [1, 2, 3, 4, 5, 6, 7]])
    context = DraftContext(tokens=tokens, begin=torch.tensor([2, 0]), end=torch.tensor([7, 7]), rows=torch.tensor([0, 1]), step=0, sampling=SamplingConfig())
    draft = PromptLookupDrafter(max_ngram=2).propose(context, 3)
    assert draft.lengths.tolist() == [3, 0]
    assert draft.tokens[0].tolist() == [6, 4, 5]
    assert draft.probs is None


def test_signals_describe_the_match():
    """Draft.signals holds the matched n, log of the match's age and log of its occurrences for every position; zeros without a match."""
    tokens = torch.tensor([[4, 5, 6, 9, 4, 5, 6, 4, 5], [1, 2, 3, 4, 5, 6, 7, 8, 9]])
    context = DraftContext(tokens=tokens, begin=torch.tensor([0, 0]), end=torch.tensor([9, 9]), rows=torch.tensor([0, 1]), step=0, sampling=SamplingConfig())
    draft = PromptLookupDrafter(max_ngram=2).propose(context, 3)
    # "4 5" occurred at 0 and 4; the latest continuation starts at index 6, three tokens before the end.
    assert draft.tokens[0].tolist() == [6, 4, 5] and draft.signals.shape == (2, 3, 3)
    assert torch.allclose(draft.signals[0], torch.tensor([2.0, math.log(3), math.log(2)]).expand(3, 3))
    assert not draft.signals[1].any()


@pytest.mark.parametrize("kwargs", [{"max_ngram": 0}, {"min_ngram": 4, "max_ngram": 2}, {"max_draft_tokens": 0}])
def test_bad_sizes_are_refused(kwargs):
    """Sizes below 1 or min above max are refused."""
    with pytest.raises(ValueError):
        PromptLookupDrafter(**kwargs)


@given(ragged_token_rows(), st.integers(1, 4), st.integers(1, 4), st.integers(1, 6))
def test_batched_proposal_equals_the_plain_python_lookup(rows, max_ngram, min_ngram, max_draft_tokens):
    """propose drafts exactly the plain-Python oracle's continuation, length and signals for every row at once."""
    tokens, begin, end = rows
    min_ngram = min(min_ngram, max_ngram)
    context = DraftContext(tokens=tokens, begin=begin, end=end, rows=torch.arange(tokens.shape[0]), step=0, sampling=SamplingConfig())
    draft = PromptLookupDrafter(max_ngram=max_ngram, min_ngram=min_ngram).propose(context, max_draft_tokens)
    for row in range(tokens.shape[0]):
        match = oracle_lookup(tokens[row, begin[row] : end[row]].tolist(), max_ngram, min_ngram, max_draft_tokens)
        continuation, ngram, age, occurrences = ([], 0, 1, 1) if match is None else match
        assert int(draft.lengths[row]) == len(continuation)
        assert draft.tokens[row, : len(continuation)].tolist() == continuation
        expected = [0.0] * 3 if match is None else [ngram, math.log(age), math.log(occurrences)]
        assert draft.signals[row, 0].tolist() == pytest.approx(expected, abs=1e-6)


@given(ragged_token_rows(), st.sets(st.integers(0, 4)))
def test_drafting_a_subset_of_rows_equals_drafting_them_all(rows, chosen):
    """With context.draft_rows, the named rows get the draft they get when every row is drafted; the others get nothing."""
    tokens, begin, end = rows
    subset = torch.tensor(sorted(row for row in chosen if row < tokens.shape[0]), dtype=torch.long)
    drafts = [
        PromptLookupDrafter(max_ngram=2, min_ngram=1).propose(
            DraftContext(tokens=tokens, begin=begin, end=end, rows=torch.arange(tokens.shape[0]), step=0, sampling=SamplingConfig(), draft_rows=draft_rows), 3
        )
        for draft_rows in (None, subset)
    ]
    every, some = drafts
    others = torch.ones(tokens.shape[0], dtype=torch.bool)
    others[subset] = False
    if subset.numel() > 0:
        assert torch.equal(some.lengths[subset], every.lengths[subset]) and torch.equal(some.tokens[subset], every.tokens[subset])
        assert torch.equal(some.signals[subset], every.signals[subset])
    assert not bool(some.lengths[others].any())
