"""dspark.stats: what one step's record says."""

import torch

from dspark.stats import StepRecord


def _record(drafted, drafted_for=None) -> StepRecord:
    rows = len(drafted)
    zeros = torch.zeros(rows, dtype=torch.long)
    return StepRecord(rows=torch.arange(rows), verify_lengths=zeros, accepted=zeros, emitted=zeros + 1, drafted=torch.tensor(drafted),
                      survival=None, draft_seconds=0.0, verify_seconds=0.0, cache_slots=0, drafted_for=drafted_for)


def test_asked_is_drafted_for_where_the_loop_kept_it_else_the_rows_with_a_proposal():
    """A row asked for a draft that proposed nothing (lookup without a match) still counts; without drafted_for, a proposal does."""
    assert _record([0, 3, 0], drafted_for=torch.tensor([True, True, False])).asked.tolist() == [True, True, False]
    assert _record([0, 3, 0]).asked.tolist() == [False, True, False]
