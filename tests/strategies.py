"""Hypothesis strategies shared by the property tests."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from dspark.types import SamplingConfig


@st.composite
def verify_problems(draw, max_rows: int = 4, max_width: int = 6, max_vocab: int = 12):
    """(draft_tokens [R, γ], verify_lengths [R], target_logits [R, γ+1, V], draft_logits [R, γ, V])."""
    rows = draw(st.integers(1, max_rows))
    width = draw(st.integers(0, max_width))
    vocab = draw(st.integers(2, max_vocab))
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    scale = draw(st.sampled_from([0.1, 1.0, 5.0]))
    target_logits = torch.randn((rows, width + 1, vocab), generator=generator) * scale
    draft_logits = torch.randn((rows, width, vocab), generator=generator) * scale
    # Mix drafts that copy the target's argmax with random ones so every prefix length occurs.
    copy = torch.rand((rows, width), generator=generator) < draw(st.sampled_from([0.0, 0.5, 0.9, 1.0]))
    random_tokens = torch.randint(0, vocab, (rows, width), generator=generator)
    draft_tokens = torch.where(copy, target_logits[:, :width].argmax(dim=-1), random_tokens)
    verify_lengths = torch.tensor([draw(st.integers(0, width)) for _ in range(rows)], dtype=torch.long)
    return draft_tokens, verify_lengths, target_logits, draft_logits


@st.composite
def sampling_configs(draw):
    """Sampling configs across temperature, top-k and top-p, including no warping at all."""
    return SamplingConfig(
        do_sample=True,
        temperature=draw(st.sampled_from([0.3, 0.7, 1.0, 1.5])),
        top_k=draw(st.sampled_from([None, 0, 1, 3, 50])),
        top_p=draw(st.sampled_from([None, 0.1, 0.5, 0.9, 1.0])),
    )


def logits_tensors(max_rows: int = 3, max_vocab: int = 20):
    """Random float logits [R, V] with occasional ties."""
    return st.builds(
        lambda rows, vocab, seed, ties: _logits(rows, vocab, seed, ties),
        st.integers(1, max_rows), st.integers(1, max_vocab), st.integers(0, 2**31 - 1), st.booleans(),
    )


def _logits(rows: int, vocab: int, seed: int, ties: bool) -> torch.Tensor:
    logits = torch.randn((rows, vocab), generator=torch.Generator().manual_seed(seed)) * 3
    return logits.round() if ties else logits


@st.composite
def linear_problems(draw, max_features: int = 40, max_rows: int = 24):
    """(x, weight [out, in], bias [out] or None) for y = x Wᵀ + b: x is 1-D, 2-D (sometimes a
    non-contiguous view) or 3-D, with one row or several."""
    out_features = draw(st.integers(1, max_features))
    in_features = draw(st.integers(1, max_features))
    leading = draw(st.one_of(st.just(()), st.tuples(st.integers(1, max_rows)), st.tuples(st.integers(1, 4), st.integers(1, max_rows // 4))))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    weight = torch.randn((out_features, in_features), generator=generator) / in_features**0.5
    bias = torch.randn((out_features,), generator=generator) if draw(st.booleans()) else None
    if len(leading) == 1 and draw(st.booleans()):
        x = torch.randn((in_features, *leading), generator=generator).T  # a strided view, as after a transpose
    else:
        x = torch.randn((*leading, in_features), generator=generator)
    return x, weight, bias
