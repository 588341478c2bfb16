"""Tests of the shared logit warping in dspark.verify.warping."""

import attrs
import pytest
import torch
from hypothesis import given

from dspark.types import SamplingConfig
from dspark.verify.warping import warp_logits, warped_probs
from tests.strategies import logits_tensors, sampling_configs


@given(logits_tensors(), sampling_configs())
def test_warped_probs_are_distributions(logits, sampling):
    """Warped probabilities are non-negative, sum to one and keep a most likely token."""
    probs = warped_probs(logits, sampling)
    assert bool((probs >= 0).all())
    assert torch.allclose(probs.sum(dim=-1), torch.ones(logits.shape[0]), atol=1e-5)
    most_likely = logits == logits.max(dim=-1, keepdim=True).values
    assert bool(((probs * most_likely).sum(dim=-1) > 0).all())


@given(logits_tensors(), sampling_configs())
def test_top_k_limits_support(logits, sampling):
    """At most k tokens (plus ties with the k-th) survive top-k; top_k None or 0 changes nothing."""
    probs = warped_probs(logits, sampling)
    if sampling.top_k:
        kth = torch.topk(logits, min(sampling.top_k, logits.shape[1]), dim=-1).values[:, -1:]
        assert bool(((probs > 0) <= (logits >= kth)).all())
    else:
        assert torch.equal(probs, warped_probs(logits, attrs.evolve(sampling, top_k=50_000)))


@given(logits_tensors(), sampling_configs())
def test_top_p_keeps_enough_mass(logits, sampling):
    """The tokens top-p keeps carried at least top_p of the mass before truncation."""
    if sampling.top_p is None:
        return
    before = (logits.float() / sampling.temperature).softmax(dim=-1)
    if sampling.top_k:
        kth = torch.topk(logits, min(sampling.top_k, logits.shape[1]), dim=-1).values[:, -1:]
        before = torch.where(logits >= kth, before, 0.0)
        before = before / before.sum(dim=-1, keepdim=True)
    kept = warped_probs(logits, sampling) > 0
    assert bool(((before * kept).sum(dim=-1) >= sampling.top_p - 1e-5).all())


@given(logits_tensors())
def test_greedy_config_leaves_logits_unwarped(logits):
    """With do_sample=False temperature and truncation are ignored."""
    sampling = SamplingConfig(do_sample=False, temperature=0.1, top_k=1, top_p=0.1)
    assert torch.equal(warp_logits(logits, sampling), logits.float())


@given(logits_tensors(), sampling_configs())
def test_warped_probs_follow_the_hf_order_of_warping(logits, sampling):
    """warped_probs is softmax of temperature, then top-k, then top-p, written out independently here
    (the drafter and the acceptance rule both call it, so p and q are warped alike)."""
    scaled = logits.float() / sampling.temperature
    if sampling.top_k:
        kth = torch.topk(scaled, min(sampling.top_k, scaled.shape[1]), dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if sampling.top_p is not None and sampling.top_p < 1.0:
        probs = scaled.softmax(dim=-1)
        for row in range(scaled.shape[0]):
            order = torch.argsort(scaled[row], stable=True)  # ascending: drop from the least likely
            cumulative = probs[row][order].cumsum(dim=0)
            for position, token in enumerate(order.tolist()[:-1]):
                if cumulative[position] <= 1.0 - sampling.top_p:
                    scaled[row, token] = float("-inf")
    assert torch.allclose(warped_probs(logits, sampling), scaled.softmax(dim=-1), atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"do_sample": True, "temperature": 0.0}, ValueError),
        ({"do_sample": True, "temperature": -1.0}, ValueError),
        ({"top_p": 0.0}, ValueError),
        ({"top_p": 1.5}, ValueError),
        ({"top_k": -1}, ValueError),
        ({"do_sample": "yes"}, TypeError),
    ],
)
def test_sampling_config_refuses_bad_values(kwargs, error):
    """Bad sampling settings raise with the argument's name in the message."""
    with pytest.raises(error, match=next(iter(kwargs)) if "do_sample" not in kwargs or len(kwargs) == 1 else "temperature"):
        SamplingConfig(**kwargs)
