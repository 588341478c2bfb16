"""Teacher-forced greedy agreement: how much of the target's own greedy text a drafter would draft.

For a sequence of prompt and answer tokens x_0..x_{L−1} with the answer from position P on, every
position a from the prompt's last (P − 1, where generation's first block starts) with a + γ < L is
an anchor, as in training. The drafter's block from a drafts x̂_{a+1..a+γ} from
the target's features of positions < a (``SemiARDrafter.training_outputs``, the true previous token
fed to the sequential head); the target's greedy choice after position a + k − 1 is
y_{a+k} = argmax p_t(· | x_{≤a+k−1}). Block a agrees up to n_a = max{n : x̂_{a+k} = y_{a+k} for all k ≤ n}.

On the target's own greedy answers (x = y there) this is what greedy verification with every drafted
position verified accepts from that anchor: first-position agreement P(n_a ≥ 1) and
τ = 1 + mean n_a. Over *every* anchor that reads higher than generation does: generation drafts only
from the anchors of its walk, a_0 = P − 1 and a_{i+1} = a_i + n_{a_i} + 1, each just after the
token where the previous block missed, which is harder than an average position. ``anchors="walk"``
scores those alone, which is the generate loop's own count for its full-width blocks. Neither needs
timing, so candidates can be compared while other jobs run.
"""

from __future__ import annotations

import attrs
import torch

from dspark.checks import int_at_least

__all__ = ["ANCHOR_SETS", "Agreement", "TargetPass", "agreeing_prefixes", "greedy_agreement", "walk"]

#: Which anchors ``greedy_agreement`` scores: all of them, or generation's walk (module docstring).
ANCHOR_SETS = ("all", "walk")


@attrs.frozen
class Agreement:
    """Counts over anchor blocks: ``blocks``, ``first`` (blocks whose first drafted token is the target's
    greedy choice) and ``accepted`` (Σ n_a, the agreeing prefix lengths)."""

    blocks: int = attrs.field(default=0, validator=int_at_least(0))
    first: int = attrs.field(default=0, validator=int_at_least(0))
    accepted: int = attrs.field(default=0, validator=int_at_least(0))

    def __attrs_post_init__(self):
        if self.first > self.blocks or self.first > self.accepted:
            raise ValueError(f"first must be at most blocks and accepted, got first={self.first}, blocks={self.blocks}, accepted={self.accepted}")

    @classmethod
    def of(cls, prefixes: torch.Tensor) -> "Agreement":
        """The counts of agreeing prefix lengths n_a, ``prefixes`` [A]."""
        return cls(blocks=prefixes.numel(), first=int((prefixes > 0).sum()), accepted=int(prefixes.sum()))

    def __add__(self, other: "Agreement") -> "Agreement":
        return Agreement(self.blocks + other.blocks, self.first + other.first, self.accepted + other.accepted)

    @property
    def first_rate(self) -> float:
        """P(n_a ≥ 1); 0.0 over no blocks."""
        return self.first / self.blocks if self.blocks else 0.0

    @property
    def tau(self) -> float:
        """1 + mean n_a: tokens per verify step with every drafted position verified; 1.0 over no blocks."""
        return 1.0 + self.accepted / self.blocks if self.blocks else 1.0


@attrs.frozen(eq=False)
class TargetPass:
    """One target forward over a sequence ``tokens`` [L]: every hidden state [1, L, d] and the greedy
    choice after each position, ``choices`` [L]. Made once per text, shared by every drafter scored on it."""

    tokens: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...]
    choices: torch.Tensor

    @classmethod
    @torch.inference_mode()
    def of(cls, target, tokens: torch.Tensor) -> "TargetPass":
        """The pass of ``target`` (a transformers causal LM) over ``tokens`` [L]."""
        if tokens.dim() != 1:
            raise ValueError(f"tokens must be one sequence [L], got shape {tuple(tokens.shape)}")
        outputs = target(input_ids=tokens[None], output_hidden_states=True)
        return cls(tokens=tokens, hidden_states=tuple(outputs.hidden_states), choices=outputs.logits[0].argmax(dim=-1).to(tokens.device))


@torch.inference_mode()
def agreeing_prefixes(drafter, target_pass: TargetPass, prompt_length: int) -> torch.Tensor:
    """n_a for every anchor a = P − 1 .. L − 1 − γ of the pass's tokens, whose answer starts at
    ``prompt_length`` = P (module docstring), LongTensor[A] (empty when no block fits): one
    teacher-forced pass of ``drafter`` (a ``SemiARDrafter``) on ``target_pass``."""
    tokens = target_pass.tokens
    if not 1 <= prompt_length <= tokens.numel():
        raise ValueError(f"prompt_length must be in [1, {tokens.numel()}] for these tokens, got {prompt_length!r}")
    gamma, length = drafter.config.max_draft_tokens, tokens.numel()
    if length - gamma <= prompt_length - 1:
        return torch.zeros(0, dtype=torch.long, device=tokens.device)
    anchors = torch.arange(prompt_length - 1, length - gamma, device=tokens.device)
    features = torch.cat([target_pass.hidden_states[layer] for layer in drafter.target_layers], dim=-1)
    # y_{a+k} for k = 1..γ is the target's argmax after position a + k − 1.
    choices = target_pass.choices[anchors[:, None] + torch.arange(gamma, device=tokens.device)]
    logits, _ = drafter.training_outputs(features.to(tokens.device), tokens[None], anchors[None])
    drafted = drafter.draft_vocab[logits[0].argmax(dim=-1)]
    return (drafted == choices).long().cumprod(dim=-1).sum(dim=-1)


def walk(prefixes: torch.Tensor) -> torch.Tensor:
    """Indices into ``prefixes`` [A] (n_a of consecutive anchors) of generation's walk: 0, then each
    i + n_i + 1 while it is below A."""
    steps, index, counts = [], 0, prefixes.tolist()
    while index < len(counts):
        steps.append(index)
        index += counts[index] + 1
    return torch.tensor(steps, dtype=torch.long, device=prefixes.device)


def greedy_agreement(drafter, target_pass: TargetPass, prompt_length: int, anchors: str = "all") -> Agreement:
    """The ``Agreement`` counts of ``agreeing_prefixes`` over every anchor, or over generation's ``walk``."""
    if anchors not in ANCHOR_SETS:
        raise ValueError(f"anchors must be one of {ANCHOR_SETS}, got {anchors!r}")
    prefixes = agreeing_prefixes(drafter, target_pass, prompt_length)
    return Agreement.of(prefixes[walk(prefixes)] if anchors == "walk" else prefixes)
