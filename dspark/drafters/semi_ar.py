"""DSpark's semi-autoregressive drafter (paper §3.1 and §3.2.1).

Notation: the target's hidden states of layers l_1..l_m at the committed context positions are
concatenated and projected, H_ctx = RMSNorm(W_c [H(l_1); …; H(l_m)]) (eq. 2). A parallel backbone
of a few draft layers reads the block [E(x_0), m, …, m] (the anchor x_0's embedding, then γ−1 mask
embeddings), attends bidirectionally inside the block and to H_ctx injected as keys and values
(eq. 3), and yields hidden states h_1..h_γ and base logits U_k = h_k · E_outᵀ over the draft
vocabulary. A light sequential head adds a prefix-dependent bias B_k and samples left to right
from p_k = softmax(U_k + B_k) (eq. 4):

* ``markov``: B_k = W1[x_{k−1}] · W2 (eq. 5), with W1[x] = E(x) · A tied to the target's frozen
  embedding (A ∈ R^{d×r}) and W2 ∈ R^{r×N};
* ``rnn``: s_k = σ(g) ⊙ s_{k−1} + (1 − σ(g)) ⊙ tanh(c), B_k = W2ᵀ tanh(o), where g, c, o are one
  linear map of z_k = [s_{k−1}; W1[x_{k−1}]; h_k] (eq. 6);
* ``None``: B_k = 0, the parallel-only (DFlash-like) ablation.

``anchor_input="feature"`` (drafter v2) also gives the block its anchor's context directly, as EAGLE
does: the anchor position reads F([H_ctx(a−1); E(x_0)]) instead of E(x_0), where H_ctx(a−1) is the
projected target feature of the position just before the anchor (the one that predicted x_0) and
F a linear map started at their sum. With ``"embedding"`` (v1) that feature is reachable only
through attention to the context.

``backbone="autoregressive"`` is the EAGLE/MTP-like ablation: the same layers read
[E(x_0), E(x_1), …, E(x_{k−1})] causally and are run again for every drafted position.

The confidence head gives c_k = σ(wᵀ [h_k; W1[x_{k−1}]]) (eq. 7): it sees x_{k−1}, never x_k, so a
policy reading it stays non-anticipating. The embedding and LM head are the target's, shared and
frozen; the draft vocabulary is the N most frequent target tokens (q = 0 outside it, which keeps
rejection sampling exact).
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from dspark.checks import deprecated_alias, int_at_least, unit_interval
from dspark.kv import RaggedCache, last_live_column
from dspark.types import Draft, DraftContext, GenerationStart, StepOutcome
from dspark.verify.calibration import CalibrationFile, file_fingerprint
from dspark.verify.confidence import DrafterConfidence
from dspark.verify.estimators import calibrated_estimator
from dspark.verify.policies import FixedLength, Threshold
from dspark.verify.schedulers import HardwareAwareScheduler
from dspark.verify.warping import draw, warped_probs

__all__ = ["SEMI_AR_SIGNALS", "SemiARConfig", "SemiARDrafter", "TargetSignature", "default_target_layers"]

SEQUENTIAL_HEADS = ("markov", "rnn", None)
BACKBONES = ("parallel", "autoregressive")
ANCHOR_INPUTS = ("embedding", "feature")
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
#: The columns of ``Draft.signals`` a SemiARDrafter fills: the confidence head's and the draft
#: distribution's belief, as logits (clamped to [SIGNAL_EPS, 1 − SIGNAL_EPS] first).
SEMI_AR_SIGNALS = ("logit_confidence", "logit_max_probability")
SIGNAL_EPS = 1e-6


@attrs.frozen
class TargetSignature:
    """What a drafter was trained for: the target's class, hidden size and vocabulary size."""

    architecture: str
    hidden_size: int
    vocab_size: int

    @classmethod
    def of(cls, target: nn.Module) -> "TargetSignature":
        """The signature of a Hugging Face causal LM."""
        return cls(
            architecture=type(target).__name__,
            hidden_size=target.get_input_embeddings().weight.shape[1],
            vocab_size=target.get_output_embeddings().weight.shape[0],
        )


def default_target_layers(num_layers: int, count: int = 3) -> tuple[int, ...]:
    """``count`` evenly spaced indices into the target's hidden states, from its first layer to its last but one."""
    if num_layers < 2:
        return (num_layers,)
    return tuple(sorted({round(1 + index * (num_layers - 2) / max(count - 1, 1)) for index in range(count)}))


@attrs.frozen
class SemiARConfig:
    """Shape of a semi-autoregressive drafter; saved as JSON beside its safetensors weights."""

    target: TargetSignature
    target_layers: tuple[int, ...] = attrs.field(converter=tuple)
    max_draft_tokens: int = attrs.field(default=7, validator=int_at_least(1))  # γ, the block width it is trained for
    num_layers: int = attrs.field(default=2, validator=int_at_least(1))
    num_heads: int = attrs.field(default=4, validator=int_at_least(1))
    intermediate_size: int = attrs.field(default=1024, validator=int_at_least(1))
    sequential: str | None = attrs.field(default="markov")
    backbone: str = "parallel"
    rank: int = attrs.field(default=64, validator=int_at_least(1))
    draft_vocab_size: int | None = None
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    # The verify rule ``wrap`` uses when given no policy, chosen by measurement on calibration prompts:
    # a threshold on the confidence head's survival when set, else every drafted token.
    verify_threshold: float | None = attrs.field(default=None, validator=unit_interval(optional=True))
    # What the anchor position reads: its token's embedding (v1), or that fused with the projected
    # target feature of the position before it (v2; see the module docstring).
    anchor_input: str = "embedding"

    def __attrs_post_init__(self):
        if self.anchor_input not in ANCHOR_INPUTS:
            raise ValueError(f"anchor_input must be one of {ANCHOR_INPUTS}, got {self.anchor_input!r}")
        if self.backbone not in BACKBONES:
            raise ValueError(f"backbone must be one of {BACKBONES}, got {self.backbone!r}")
        if self.anchor_input == "feature" and self.backbone != "parallel":
            raise ValueError(f"anchor_input 'feature' needs the parallel backbone, got backbone={self.backbone!r}")
        if self.sequential not in SEQUENTIAL_HEADS:
            raise ValueError(f"sequential must be one of {SEQUENTIAL_HEADS}, got {self.sequential!r}")
        if not self.target_layers:
            raise ValueError(f"target_layers must name at least one target layer, got {self.target_layers!r}")
        if self.target.hidden_size % self.num_heads:
            raise ValueError(f"num_heads must divide the target's hidden size {self.target.hidden_size}, got {self.num_heads!r}")
        if self.draft_vocab_size is not None and not 1 <= self.draft_vocab_size <= self.target.vocab_size:
            raise ValueError(
                f"draft_vocab_size must be None or in [1, {self.target.vocab_size}], got {self.draft_vocab_size!r}"
            )

    @classmethod
    def for_target(cls, target, **overrides) -> "SemiARConfig":
        """A config for ``target`` (a transformers causal LM): its signature, ``default_target_layers`` of
        its depth and its attention head count, then ``overrides`` (any other field)."""
        values = {
            "target": TargetSignature.of(target),
            "target_layers": default_target_layers(target.config.num_hidden_layers),
            "num_heads": target.config.num_attention_heads,
        }
        return cls(**(values | overrides))

    @property
    def hidden_size(self) -> int:
        """The draft layers' width: the target's, since embedding and LM head are shared."""
        return self.target.hidden_size

    @property
    def vocab_size(self) -> int:
        """N, the number of tokens the drafter can propose."""
        return self.draft_vocab_size or self.target.vocab_size

    def to_json(self) -> str:
        return json.dumps(attrs.asdict(self), indent=2)

    block_size = deprecated_alias("max_draft_tokens", "block_size")

    @classmethod
    def from_json(cls, text: str) -> "SemiARConfig":
        """The config ``to_json`` wrote (older files that name γ ``block_size`` load too)."""
        values = json.loads(text)
        if "block_size" in values:
            values["max_draft_tokens"] = values.pop("block_size")
        return cls(target=TargetSignature(**values.pop("target")), **values)


@attrs.frozen
class _SharedTargetParts:
    """The target's frozen input embedding and LM head, referenced (not copied, not registered)."""

    embedding: nn.Module
    head_weight: torch.Tensor


@attrs.frozen
class _OutputHead:
    """A frozen LM head weight [N, d], in the shape ``get_output_embeddings()`` returns it."""

    weight: torch.Tensor


class _RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).to(x.dtype)


@attrs.frozen
class Rotation:
    """cos and sin of the rotary angles at integer positions, [R, 1, T, hd/2] each: computed once
    per pass and shared by every layer."""

    cos: torch.Tensor
    sin: torch.Tensor

    @classmethod
    def at(cls, positions: torch.Tensor, head_dim: int, theta: float) -> "Rotation":
        """The rotation of positions [R, T] for heads of ``head_dim``, base ``theta``."""
        half = head_dim // 2
        frequencies = theta ** (-torch.arange(half, device=positions.device, dtype=torch.float32) / half)
        angles = positions[:, None, :, None].float() * frequencies
        return cls(cos=angles.cos(), sin=angles.sin())


def rotate(x: torch.Tensor, rotation: Rotation) -> torch.Tensor:
    """Rotary position embedding of x [R, H, T, hd] by ``rotation``."""
    half = x.shape[-1] // 2
    first, second = x[..., :half].float(), x[..., half:].float()
    cos, sin = rotation.cos, rotation.sin
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1).to(x.dtype)


def context_and_block_attention(
    query: torch.Tensor, context: tuple[torch.Tensor, torch.Tensor], block: tuple[torch.Tensor, torch.Tensor], visible: torch.Tensor
) -> torch.Tensor:
    """softmax(q·[K_ctx; K_blk]ᵀ/√hd, masked by ``visible``)·[V_ctx; V_blk] without joining the keys or values.

    query [R, H, Q, hd]; ``context`` and ``block`` (keys, values) [R, H, S, hd] and [R, H, Q, hd]; ``visible``
    [R, Q, S + Q], True where a query attends (each query must see at least one key: the block's own position
    always is). One softmax runs over both parts' scores, [R, H, Q, S + Q], which
    are hd/Q times smaller than the context's keys: concatenating those every drafting pass copied the whole
    context cache. Scores and softmax are float32 whatever the inputs' dtype.
    """
    context_keys, context_values = context
    block_keys, block_values = block
    query = query * query.shape[-1] ** -0.5
    scores = torch.cat([query @ context_keys.transpose(-1, -2), query @ block_keys.transpose(-1, -2)], dim=-1).float()
    weights = scores.masked_fill(~visible[:, None], float("-inf")).softmax(dim=-1).to(query.dtype)
    split = context_keys.shape[2]
    return weights[..., :split] @ context_values + weights[..., split:] @ block_values


class _DraftLayer(nn.Module):
    """Pre-norm attention (block queries; context and block keys/values) and a SwiGLU MLP."""

    def __init__(self, config: SemiARConfig):
        super().__init__()
        size, self.heads = config.hidden_size, config.num_heads
        self.attention_norm = _RMSNorm(size, config.rms_norm_eps)
        self.query = nn.Linear(size, size, bias=False)
        self.key = nn.Linear(size, size, bias=False)
        self.value = nn.Linear(size, size, bias=False)
        self.output = nn.Linear(size, size, bias=False)
        self.mlp_norm = _RMSNorm(size, config.rms_norm_eps)
        self.gate = nn.Linear(size, config.intermediate_size, bias=False)
        self.up = nn.Linear(size, config.intermediate_size, bias=False)
        self.down = nn.Linear(config.intermediate_size, size, bias=False)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], x.shape[1], self.heads, -1).transpose(1, 2)

    def context_keys_values(self, context: torch.Tensor, rotation: Rotation) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of context features H_ctx [R, T, d] (eq. 3) rotated to their positions, [R, H, T, hd] each."""
        return rotate(self._split(self.key(context)), rotation), self._split(self.value(context))

    def forward(self, block, rotation, context_keys, context_values, visible):
        """block [R, Q, d] rotated to its positions by ``rotation``; context K/V [R, H, S, hd]; ``visible``
        [R, Q, S + Q] says which context slots and block positions each query attends to."""
        normed = self.attention_norm(block)
        query = rotate(self._split(self.query(normed)), rotation)
        block_keys, block_values = rotate(self._split(self.key(normed)), rotation), self._split(self.value(normed))
        if query.shape[2] < query.shape[3]:
            # A drafting pass (few queries): scoring the parts apart copies Q·(S+Q) scores instead of the S·hd context.
            attended = context_and_block_attention(query, (context_keys, context_values), (block_keys, block_values), visible)
        else:  # training's many queries: joining the keys is the smaller copy, and SDPA never materialises the scores
            keys, values = torch.cat([context_keys, block_keys], dim=2), torch.cat([context_values, block_values], dim=2)
            attended = nn.functional.scaled_dot_product_attention(query, keys, values, attn_mask=visible[:, None])
        block = block + self.output(attended.transpose(1, 2).reshape(block.shape))
        normed = self.mlp_norm(block)
        return block + self.down(nn.functional.silu(self.gate(normed)) * self.up(normed))


def _anchor_fusion(size: int) -> nn.Linear:
    """F of ``anchor_input="feature"``: a linear map of [H_ctx(a−1); E(x_0)] started at their sum."""
    fusion = nn.Linear(2 * size, size, bias=False)
    with torch.no_grad():
        fusion.weight.copy_(torch.cat([torch.eye(size), torch.eye(size)], dim=1))
    return fusion


def _rederive_draft_head(drafter: "SemiARDrafter", incompatible_keys) -> None:
    """load_state_dict post-hook: the reduced head must follow the draft vocabulary just loaded."""
    drafter.draft_head = drafter._reduced_head()


class SemiARDrafter(nn.Module):
    """The DSpark drafter: a parallel backbone on target features plus a sequential head and a
    confidence head. Implements ``dspark.Drafter``; see the module docstring for the math."""

    default_draft_tokens = deprecated_alias("max_draft_tokens", "default_draft_tokens")

    def __init__(self, config: SemiARConfig, target: nn.Module, draft_vocab: torch.Tensor | None = None):
        super().__init__()
        signature = TargetSignature.of(target)
        if signature != config.target:
            raise ValueError(f"target must match the drafter's {config.target}, got {signature}")
        num_layers = target.config.get_text_config(decoder=True).num_hidden_layers
        if not all(0 <= layer <= num_layers for layer in config.target_layers):
            raise ValueError(f"target_layers must be hidden-state indices in [0, {num_layers}] of this target, got {config.target_layers!r}")
        self.config = config
        self.target_layers = config.target_layers
        self.vocab_size = config.target.vocab_size
        self.max_draft_tokens = config.max_draft_tokens
        size, rank = config.hidden_size, config.rank
        # The saved calibration of these weights (``from_pretrained`` reads it); None: uncalibrated.
        self.calibration: CalibrationFile | None = None
        self.shared = _SharedTargetParts(embedding=target.get_input_embeddings(), head_weight=target.get_output_embeddings().weight)
        if draft_vocab is None:
            draft_vocab = torch.arange(config.vocab_size)
        if tuple(draft_vocab.shape) != (config.vocab_size,):
            raise ValueError(f"draft_vocab must hold draft_vocab_size={config.vocab_size} token ids, got shape {tuple(draft_vocab.shape)}")
        self.register_buffer("draft_vocab", draft_vocab.long().clone())
        # The reduced LM head is derived from the frozen target head; not saved with the drafter, and
        # derived again whenever load_state_dict brings in another draft vocabulary (e.g. a checkpoint).
        self.register_buffer("draft_head", self._reduced_head(), persistent=False)
        self.register_load_state_dict_post_hook(_rederive_draft_head)
        self.context_projection = nn.Linear(len(config.target_layers) * size, size, bias=False)
        self.context_norm = _RMSNorm(size, config.rms_norm_eps)
        self.mask_embedding = nn.Parameter(torch.zeros(size))
        self.anchor_fusion = _anchor_fusion(size) if config.anchor_input == "feature" else None
        self.layers = nn.ModuleList(_DraftLayer(config) for _ in range(config.num_layers))
        self.final_norm = _RMSNorm(size, config.rms_norm_eps)
        # W1[x] = E(x)·A, tied to the frozen embedding; W2 maps rank r to draft-vocabulary logits.
        self.transition_in = nn.Linear(size, rank, bias=False)
        self.transition_out = nn.Parameter(torch.zeros(rank, config.vocab_size))
        self.recurrent = nn.Linear(2 * rank + size, 3 * rank) if config.sequential == "rnn" else None
        self.confidence_head = nn.Linear(size + rank, 1)
        self._context: RaggedCache | None = None
        # H_ctx of each row's last committed position [R, d], which the anchor reads when anchor_input is "feature".
        self._last_context: torch.Tensor | None = None
        # Committed target features not yet read into the context cache: read when the next draft needs them.
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._vocab_features: tuple[tuple, torch.Tensor] | None = None

    # -- parts of one proposal ---------------------------------------------------------------

    def _reduced_head(self) -> torch.Tensor | None:
        """The target LM head's rows for ``draft_vocab``, or None when that is the whole vocabulary in order."""
        head = self.shared.head_weight.detach()
        if self.draft_vocab.numel() == head.shape[0] and torch.equal(self.draft_vocab.cpu(), torch.arange(head.shape[0])):
            return None
        return head[self.draft_vocab.to(head.device)].clone()

    def _head_weight(self) -> torch.Tensor:
        return self.shared.head_weight if self.draft_head is None else self.draft_head

    def get_output_embeddings(self) -> "_OutputHead":
        """The drafter's LM head, as Hugging Face models expose theirs: ``.weight`` is the target's
        head restricted to the draft vocabulary [N, d] (frozen). dspark's fast path reads it to
        give this product a faster weight layout."""
        return _OutputHead(weight=self._head_weight())

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The frozen target embedding of ``tokens``; no gradient ever reaches the target."""
        with torch.no_grad():
            return self.shared.embedding(tokens).to(self.mask_embedding.dtype)

    def anchor_input(self, anchors: torch.Tensor, previous_context: torch.Tensor | None) -> torch.Tensor:
        """The anchor position's input [..., d]: E(x_0), or F([H_ctx(a−1); E(x_0)]) with
        ``previous_context`` [..., d] when the config's ``anchor_input`` is "feature"."""
        embedding = self._embed(anchors)
        if self.anchor_fusion is None:
            return embedding
        return self.anchor_fusion(torch.cat([previous_context.to(embedding.dtype), embedding], dim=-1))

    def _rotation(self, positions: torch.Tensor) -> Rotation:
        return Rotation.at(positions, self.config.hidden_size // self.config.num_heads, self.config.rope_theta)

    def previous_token_features(self, tokens: torch.Tensor) -> torch.Tensor:
        """W1[x] = E(x)·A for target token ids ``tokens`` [...], [..., r]."""
        return self.transition_in(self._embed(tokens))

    def project_context(self, features: torch.Tensor) -> torch.Tensor:
        """H_ctx = RMSNorm(W_c [H(l_1); …; H(l_m)]) for target features [..., m·d] (eq. 2)."""
        return self.context_norm(self.context_projection(features.to(self.context_projection.weight.dtype)))

    def extend_context(self, features: torch.Tensor, feature_mask: torch.Tensor) -> None:
        """Append the committed target features [R, T, m·d] to the per-layer context key/value cache."""
        # Trailing columns no row committed (rejected drafts) would only be cropped again: skip their work.
        width = last_live_column(feature_mask)
        features, feature_mask = features[:, :width], feature_mask[:, :width]
        context = self.project_context(features)
        if self.anchor_fusion is not None:
            self._remember_last_context(context, feature_mask)
        offsets = (feature_mask.long().cumsum(dim=1) - 1).clamp_min(0)
        rotation = self._rotation(self._context.lengths[:, None] + offsets)
        for index, layer in enumerate(self.layers):
            keys, values = layer.context_keys_values(context, rotation)
            self._context.cache.update(keys, values, index)
        self._context.commit(feature_mask)

    def _remember_last_context(self, context: torch.Tensor, feature_mask: torch.Tensor) -> None:
        """Keep H_ctx of each row's last committed column of ``context`` [R, T, d] (rows committing nothing keep theirs)."""
        columns = torch.arange(1, feature_mask.shape[1] + 1, device=feature_mask.device)
        last = (feature_mask.long() * columns).argmax(dim=1)
        latest = context[torch.arange(context.shape[0], device=context.device), last]
        committed = feature_mask.any(dim=1, keepdim=True)
        self._last_context = latest if self._last_context is None else torch.where(committed, latest, self._last_context)

    def backbone(self, block: torch.Tensor, causal: bool, selected: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states [R, W, d] of the block embeddings [R, W, d] placed right after the context of the
        rows ``selected`` (all when None): bidirectional inside the block (parallel backbone) or causal
        (autoregressive ablation)."""
        rows, width = block.shape[:2]
        live = self._context.live if selected is None else self._context.live[selected]
        rotation = self._rotation(live.sum(dim=1)[:, None] + torch.arange(width, device=block.device))
        layer_caches = [(layer.keys, layer.values) for layer in self._context.cache.layers] if self._context.slots else []
        inside = torch.ones((width, width), dtype=torch.bool, device=block.device)
        inside = inside.tril() if causal else inside
        visible = torch.cat([live.bool()[:, None, :].expand(rows, width, -1), inside.expand(rows, -1, -1)], dim=2)
        for index, layer in enumerate(self.layers):
            if layer_caches:
                context_keys, context_values = layer_caches[index]
                if selected is not None:
                    context_keys, context_values = context_keys[selected], context_values[selected]
            else:
                context_keys = context_values = block.new_zeros((rows, layer.heads, 0, block.shape[-1] // layer.heads))
            block = layer(block, rotation, context_keys, context_values, visible)
        return self.final_norm(block)

    def _base_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """U = h · E_outᵀ over the draft vocabulary, float32; hidden [..., d]."""
        # One 2-D product (a batched one would broadcast the head), through F.linear so that dspark's
        # fast path picks the quickest formulation for the few rows of a proposal.
        rows = hidden.reshape(-1, hidden.shape[-1])
        head = self._head_weight()
        # The target's head is frozen: no gradient may reach it while training. Outside autograd the
        # tensor itself (not a detached view) is passed, so the fast path finds the copy made for it.
        head = head.detach() if torch.is_grad_enabled() else head
        return nn.functional.linear(rows, head.to(hidden.dtype)).reshape(*hidden.shape[:-1], -1).float()

    def transition_bias(self, previous_features: torch.Tensor, hidden: torch.Tensor, state: torch.Tensor | None):
        """(B_k [..., N], next recurrent state) from W1[x_{k−1}] [..., r] for the configured sequential head."""
        if self.config.sequential is None:
            return None, state
        if self.config.sequential == "markov":
            return previous_features @ self.transition_out, state
        gate, candidate, output = self.recurrent(torch.cat([state, previous_features, hidden], dim=-1)).chunk(3, dim=-1)
        keep = torch.sigmoid(gate)
        state = keep * state + (1 - keep) * torch.tanh(candidate)
        return torch.tanh(output) @ self.transition_out, state

    def draft_vocab_features(self) -> torch.Tensor:
        """W1[x] for every draft-vocabulary token, [N, r]: one row lookup per drafted position instead
        of an embedding and a projection. Derived from the weights, and derived again whenever they change."""
        key = tuple(
            (tensor.data_ptr(), tensor.dtype, None if tensor.is_inference() else tensor._version)
            for tensor in (self.transition_in.weight, self.shared.embedding.weight, self.draft_vocab)
        )
        if self._vocab_features is None or self._vocab_features[0] != key:
            with torch.inference_mode():
                self._vocab_features = (key, self.previous_token_features(self.draft_vocab))
        return self._vocab_features[1]

    def training_outputs(self, features: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced drafts for K anchors per sequence, all in one pass (paper §3.3).

        ``features`` [B, L, m·d]: the target's hidden states of ``target_layers`` at every position;
        ``tokens`` [B, L]; ``anchors`` [B, K]: anchor positions a with a + γ < L. Block j sees the
        context positions < a_j and its own γ positions; the sequential head is fed the true
        previous tokens x_{a+k−1}. Returns draft logits U_k + B_k [B, K, γ, N] and confidence
        c_k [B, K, γ].
        """
        batch, length = tokens.shape
        anchors_per_row, width = anchors.shape[1], self.config.max_draft_tokens
        offsets = torch.arange(width, device=tokens.device)
        context = self.project_context(features)
        context_positions = torch.arange(length, device=tokens.device).expand(batch, length)
        block_positions = (anchors[:, :, None] + offsets).reshape(batch, anchors_per_row * width)
        previous = tokens.gather(1, block_positions)
        if self.config.backbone == "parallel":
            # H_ctx(a − 1); an anchor at position 0 has no earlier position and reads zeros (never its own feature).
            previous_context = context.gather(1, (anchors - 1).clamp_min(0)[..., None].expand(-1, -1, context.shape[-1]))
            previous_context = previous_context * (anchors >= 1)[..., None]
            anchor_embeddings = self.anchor_input(tokens.gather(1, anchors), previous_context)
            block = torch.cat([anchor_embeddings[:, :, None], self.mask_embedding.expand(batch, anchors_per_row, width - 1, -1)], dim=2)
            block = block.reshape(batch, anchors_per_row * width, -1)
        else:  # teacher forcing: position k reads the true x_{a+k−1}
            block = self._embed(previous)
        sees_context = torch.arange(length, device=tokens.device)[None, None, :] < anchors[:, :, None]
        sees_context = sees_context.repeat_interleave(width, dim=1)
        block_of = torch.arange(anchors_per_row * width, device=tokens.device) // width
        sees_block = block_of[:, None] == block_of[None, :]
        if self.config.backbone == "autoregressive":
            sees_block = sees_block & torch.ones_like(sees_block).tril()
        sees_block = sees_block.expand(batch, -1, -1)
        visible = torch.cat([sees_context, sees_block], dim=2)
        context_rotation, block_rotation = self._rotation(context_positions), self._rotation(block_positions)
        for layer in self.layers:
            context_keys, context_values = layer.context_keys_values(context, context_rotation)
            block = layer(block, block_rotation, context_keys, context_values, visible)
        hidden = self.final_norm(block).reshape(batch, anchors_per_row, width, -1)
        base_logits = self._base_logits(hidden)
        previous = previous.reshape(batch, anchors_per_row, width)
        state = hidden.new_zeros((batch, anchors_per_row, self.config.rank)) if self.config.sequential == "rnn" else None
        logits, confidence = [], []
        for k in range(width):
            previous_features = self.previous_token_features(previous[:, :, k])
            bias, state = self.transition_bias(previous_features, hidden[:, :, k], state)
            logits.append(base_logits[:, :, k] if bias is None else base_logits[:, :, k] + bias)
            confidence.append(torch.sigmoid(self.confidence_head(torch.cat([hidden[:, :, k], previous_features], dim=-1))).squeeze(-1))
        return torch.stack(logits, dim=2), torch.stack(confidence, dim=2)

    # -- defaults for wrap ---------------------------------------------------------------------

    @property
    def default_policy(self):
        """The DSpark preset when the drafter is calibrated (``HardwareAwareScheduler``: verify what pays
        on this machine, from the calibrated survival); else Threshold(verify_threshold) when the config
        names one; else FixedLength(γ)."""
        if self.config.verify_threshold is not None:
            return Threshold(self.config.verify_threshold)
        if self.calibration is not None:
            return HardwareAwareScheduler(max_draft_tokens=self.config.max_draft_tokens)
        return FixedLength(self.config.max_draft_tokens)

    @property
    def default_confidence(self):
        """When ``from_pretrained`` found a ``calibration.json``, its default estimator calibrated per
        sampling band; else the confidence head (``DrafterConfidence``) when the default policy is a
        threshold, and None for ``FixedLength``."""
        if self.calibration is not None:
            return calibrated_estimator(self.calibration)
        # FixedLength reads no survival: scoring it would only cost a copy to the host every step.
        return None if self.config.verify_threshold is None else DrafterConfidence()

    # -- Drafter protocol ----------------------------------------------------------------------

    def start(self, start: GenerationStart) -> None:
        """A new generation: an empty context cache for its rows."""
        self._context = RaggedCache(start.rows, start.device, hole_budget=self.config.max_draft_tokens + 1)
        self._last_context = None
        self._pending = []

    @torch.inference_mode()
    def propose(self, context: DraftContext, max_draft_tokens: int) -> Draft:
        """Draft ``max_draft_tokens`` tokens for the rows in ``context.draft_rows`` (all by default; the
        others get an empty draft) after reading every row's newly committed target features. Features
        of steps that draft for no row are kept and read together when a draft next needs them, so a
        generation whose rows are never drafted for never pays for reading its prompt."""
        if self._context is None:
            raise ValueError("SemiARDrafter.propose needs start(GenerationStart) first; dspark's generate calls it")
        if context.features is not None and context.features.shape[1] > 0:
            self._pending.append((context.features, context.feature_mask))
        rows, device = context.rows.numel(), context.tokens.device
        # The parallel backbone always sees the block width it was trained with; only the first max_draft_tokens are drafted.
        max_draft_tokens = min(max_draft_tokens, self.config.max_draft_tokens)
        selected = context.draft_rows
        if max_draft_tokens == 0 or (selected is not None and selected.numel() == 0):
            return Draft.empty(rows, device)
        if self._pending:
            features, masks = zip(*self._pending)
            self._pending = []
            self.extend_context(torch.cat(features, dim=1), torch.cat(masks, dim=1))
        anchors = context.anchors if selected is None else context.anchors[selected]
        draft = self._draft_block(anchors, context.sampling, context.generator, max_draft_tokens, selected)
        return draft if selected is None else draft.placed(rows, selected)

    def _draft_block(
        self, anchors: torch.Tensor, sampling, generator: torch.Generator | None, max_draft_tokens: int, selected: torch.Tensor | None
    ) -> Draft:
        """The draft of the context rows ``selected`` (all when None) from their ``anchors``.

        Only what depends on the previous draft token runs position by position (the sequential
        bias and the choice); the confidence head, the warping of greedy drafts and the scatter of
        q onto the target vocabulary run once over the whole block afterwards.
        """
        rows, device = anchors.shape[0], anchors.device
        parallel = self.config.backbone == "parallel"
        if parallel:
            previous_context = None
            if self.anchor_fusion is not None:
                previous_context = self._last_context if selected is None else self._last_context[selected]
            anchor = self.anchor_input(anchors, previous_context)[:, None]
            block = torch.cat([anchor, self.mask_embedding.expand(rows, self.config.max_draft_tokens - 1, -1)], dim=1)
            hidden = self.backbone(block, causal=False, selected=selected)
            # The head only for the positions drafted: a fallback that drafts 1-2 deep skips most of this product.
            base_logits = self._base_logits(hidden[:, :max_draft_tokens])
        features, vocab_features = self.previous_token_features(anchors), self.draft_vocab_features()
        state = self.mask_embedding.new_zeros((rows, self.config.rank)) if self.config.sequential == "rnn" else None
        tokens, block_hidden, previous_features, logits, probs = [], [], [], [], []
        for k in range(max_draft_tokens):
            if not parallel:  # the ablation re-runs its layers on [anchor, x_1..x_{k−1}] for every position
                hidden = self.backbone(self._embed(torch.stack([anchors, *tokens], dim=1)), causal=True, selected=selected)[:, -1:]
                base_logits = self._base_logits(hidden)
            position = k if parallel else 0
            bias, state = self.transition_bias(features, hidden[:, position], state)
            position_logits = base_logits[:, position] if bias is None else base_logits[:, position] + bias.float()
            if sampling.do_sample:
                probs.append(warped_probs(position_logits, sampling))
                choice = draw(probs[-1], sampling, generator)
            else:  # greedy: the argmax of the logits is the argmax of q; q itself is computed once below
                logits.append(position_logits)
                choice = position_logits.argmax(dim=-1)
            block_hidden.append(hidden[:, position])
            previous_features.append(features)
            tokens.append(self.draft_vocab[choice])
            features = vocab_features[choice]
        q = torch.stack(probs, dim=1) if sampling.do_sample else warped_probs(torch.stack(logits, dim=1), sampling)
        confidence = torch.sigmoid(self.confidence_head(torch.cat([torch.stack(block_hidden, dim=1), torch.stack(previous_features, dim=1)], dim=-1)))
        confidence = confidence.squeeze(-1).float()
        # SEMI_AR_SIGNALS: both known before x_k is drawn (the head reads x_{k−1}; max q is not q(x_k)).
        signals = torch.stack([torch.logit(confidence, eps=SIGNAL_EPS), torch.logit(q.amax(dim=-1).float(), eps=SIGNAL_EPS)], dim=-1)
        return Draft(
            tokens=torch.stack(tokens, dim=1),
            lengths=torch.full((rows,), len(tokens), dtype=torch.long, device=device),
            probs=q.new_zeros((rows, len(tokens), self.vocab_size)).index_copy_(2, self.draft_vocab, q),
            confidence=confidence,
            signals=signals,
        )

    def observe(self, outcome: StepOutcome) -> None:
        """Finished rows leave the context cache; nothing to roll back, since it only ever holds
        committed positions (the next proposal's features say which)."""
        if self._context is not None:
            self._context.drop_finished(outcome.finished)
        if self._last_context is not None and bool(outcome.finished.any()):
            self._last_context = self._last_context[~outcome.finished]
        if self._pending and bool(outcome.finished.any()):
            still = ~outcome.finished
            self._pending = [(features[still], mask[still]) for features, mask in self._pending]

    # -- persistence ----------------------------------------------------------------------------

    def save_pretrained(self, path: str | Path, dtype: torch.dtype | None = None) -> None:
        """Write ``config.json`` and ``model.safetensors`` (the drafter's own weights only), floating
        tensors cast to ``dtype`` when given (e.g. torch.float16 to ship a small file)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / CONFIG_NAME).write_text(self.config.to_json())
        weights = {
            name: (tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor).detach().contiguous().cpu()
            for name, tensor in self.state_dict().items()
        }
        save_file(weights, str(path / WEIGHTS_NAME))

    @classmethod
    def from_pretrained(cls, path: str | Path, target: nn.Module) -> "SemiARDrafter":
        """Load a drafter saved by ``save_pretrained`` for ``target``; refuses a target it was not trained for."""
        path = Path(path)
        if not (path / CONFIG_NAME).is_file() or not (path / WEIGHTS_NAME).is_file():
            raise ValueError(f"path must be a directory with {CONFIG_NAME} and {WEIGHTS_NAME}, got {str(path)!r}")
        config = SemiARConfig.from_json((path / CONFIG_NAME).read_text())
        weights = load_file(str(path / WEIGHTS_NAME))
        drafter = cls(config, target, draft_vocab=weights["draft_vocab"])
        drafter.load_state_dict(weights)
        drafter.calibration = CalibrationFile.load(path, fingerprint=file_fingerprint(path / WEIGHTS_NAME))
        if drafter.calibration is not None:
            calibrated_estimator(drafter.calibration)  # refuse a file naming an estimator it cannot build, at load
        parameter = target.get_input_embeddings().weight
        return drafter.to(device=parameter.device, dtype=parameter.dtype).eval()

