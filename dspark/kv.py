"""KV bookkeeping for a ragged batch in a standard dynamic key/value cache.

Every row shares the cache's slot axis. ``live[r, s]`` says whether slot s holds one of row r's
tokens; a rejected draft token's slot stays in the cache with live = 0, the next forward masks
it with a 0 in the 2-D attention mask and passes explicit ``position_ids`` that skip it, so the
logits equal those of a clean run. Holes are reclaimed by cropping trailing dead slots and, when
the dead slots beyond the longest row exceed the hole allowance (``hole_allowance``), by gathering
the live slots of every row into a fresh, left-padded cache (``compact``). Rows that leave the
batch are dropped in place (``Cache.batch_select_indices``). Only public Cache API is used.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer, DynamicSlidingWindowLayer

__all__ = ["HOLE_SHARE", "GrowingLayer", "RaggedCache", "check_cache_support", "empty_cache", "hole_allowance", "last_live_column"]

#: Share of the cache's slots that may be holes before a compaction.
HOLE_SHARE = 0.25


def check_cache_support(config, max_slots: int) -> None:
    """Refuse models whose cache is not the standard dynamic cache over ``max_slots`` slots.

    Sliding-window layers are accepted when the window covers every slot this generation can use
    (then they never slide); anything else (static, linear-attention, state-space caches) is refused.
    """
    for index, layer in enumerate(DynamicCache(config=config).layers):
        if isinstance(layer, DynamicSlidingWindowLayer):
            if layer.sliding_window < max_slots:
                raise ValueError(
                    f"the target's layer {index} uses a sliding-window cache of {layer.sliding_window} tokens, "
                    f"but this generation may need {max_slots} cache slots (prompt + max_new_tokens + draft blocks); "
                    f"dspark supports sliding windows only while they do not slide: shorten the prompt or max_new_tokens"
                )
        elif type(layer) is not DynamicLayer:
            raise ValueError(
                f"the target's layer {index} uses a {type(layer).__name__} cache; dspark supports the standard "
                f"dynamic key/value cache (DynamicLayer) only"
            )


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values live in a buffer with spare slots, so that ``update`` writes
    the new slots in place instead of concatenating (copying) the whole layer every call.

    ``keys``/``values`` stay what ``DynamicLayer`` promises: the cached states, here views of the buffer's
    first slots. The buffer grows by half again when full (amortised O(1) copies per slot). ``crop`` keeps the
    view's storage, so the next update writes over the cropped slots. ``batch_select_indices`` with rising
    indices (rows leaving a batch) moves the kept rows down within the buffer; anything that replaces ``keys``
    with a new tensor (other selections, ``reorder_cache``) is copied into a new buffer at the next update.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None

    @property
    def capacity(self) -> int:
        """Slots the buffer holds before the next update must grow it (0 before the first update)."""
        return 0 if self._key_buffer is None else self._key_buffer.shape[-2]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new states after the cached ones and return the cached states, [B, H, S, hd] each."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        held, new = self.get_seq_length(), key_states.shape[-2]
        if not (self._holds(self.keys, self._key_buffer, key_states) and self._holds(self.values, self._value_buffer, value_states)
                and held + new <= self._key_buffer.shape[-2]):
            capacity = held + new + max(held + new, 64) // 2
            self._key_buffer = self._moved(self.keys, key_states, held, capacity)
            self._value_buffer = self._moved(self.values, value_states, held, capacity)
        self._key_buffer[..., held : held + new, :] = key_states
        self._value_buffer[..., held : held + new, :] = value_states
        self.keys, self.values = self._key_buffer[..., : held + new, :], self._value_buffer[..., : held + new, :]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows ``indices`` of the batch, in that order.

        Rising indices, as when rows leave a batch, keep the buffer and its spare slots: each kept row whose
        place changes is copied down into its new place (lowest first, so no row is overwritten before it is
        read), the rows before the first that leaves are not touched, and no buffer is allocated. HF's layer
        copies every kept row into a new tensor, which the next update would copy again into a new buffer.
        Other indices (a reordering, repeats) select as ``DynamicLayer`` does."""
        held = self.get_seq_length()
        chosen = indices.tolist() if held > 0 and indices.dim() == 1 else []
        if not self._selects_in_place(chosen):
            super().batch_select_indices(indices)
            return
        buffers = (self._key_buffer, self._value_buffer)
        for buffer in buffers:
            for place, row in enumerate(chosen):
                if row != place:
                    buffer[place, ..., :held, :].copy_(buffer[row, ..., :held, :])
        self._key_buffer, self._value_buffer = (buffer[: len(chosen)] for buffer in buffers)
        self.keys, self.values = self._key_buffer[..., :held, :], self._value_buffer[..., :held, :]

    def _selects_in_place(self, chosen: list[int]) -> bool:
        """Whether the rows ``chosen`` rise from 0 up within the buffer that keys and values are views of."""
        rising = bool(chosen) and chosen[0] >= 0 and all(earlier < later for earlier, later in zip(chosen, chosen[1:]))
        return rising and all(
            self._holds(cached, buffer, buffer) and chosen[-1] < buffer.shape[0]
            for cached, buffer in ((self.keys, self._key_buffer), (self.values, self._value_buffer))
        )

    @staticmethod
    def _holds(cached: torch.Tensor, buffer: torch.Tensor | None, new: torch.Tensor) -> bool:
        """Whether ``cached`` is still a prefix view of ``buffer`` that ``new`` can follow in place."""
        return (
            buffer is not None and cached.numel() > 0 and cached.data_ptr() == buffer.data_ptr()
            and cached.stride() == buffer.stride() and cached.shape[:-2] == new.shape[:-2] and cached.dtype == new.dtype
        )

    @staticmethod
    def _moved(cached: torch.Tensor, new: torch.Tensor, held: int, capacity: int) -> torch.Tensor:
        """A buffer of ``capacity`` slots shaped like ``new`` holding ``cached``'s first ``held`` slots."""
        buffer = new.new_empty((*new.shape[:-2], capacity, new.shape[-1]))
        if held > 0:
            buffer[..., :held, :] = cached
        return buffer


def empty_cache(layer_class: type[DynamicLayer] = GrowingLayer) -> Cache:
    """An empty cache of ``layer_class`` layers, one per layer index a forward updates (HF's own
    ``DynamicCache`` for ``DynamicLayer``). dspark's loop and drafters, and the profiler that times them, use
    ``GrowingLayer``: a concatenating layer copies the whole cache at every step, which at many rows of long
    contexts is a large part of a CPU step (``benchmarks/bench_cache_layers.py`` compares both)."""
    if not (isinstance(layer_class, type) and issubclass(layer_class, DynamicLayer)):
        raise TypeError(f"layer_class must be DynamicLayer or a subclass (such as GrowingLayer), got {layer_class!r}")
    return DynamicCache() if layer_class is DynamicLayer else Cache(layer_class_to_replicate=layer_class)


def last_live_column(mask: torch.Tensor) -> int:
    """1 + the index of the last column of ``mask`` [R, S] that holds a nonzero, 0 if none: one host read."""
    if mask.shape[1] == 0:
        return 0
    columns = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    return int((mask.bool().any(dim=0) * columns).max())


def hole_allowance(slots: int, hole_budget: int, hole_share: float = HOLE_SHARE) -> int:
    """Dead slots beyond the longest row that a cache of ``slots`` slots keeps before compacting.

    max(hole_budget, ⌊hole_share · slots⌋). A compaction copies every slot of every layer once, and a hole
    costs what a live slot costs in each later forward (attention, and a concatenating layer's copy). Letting
    holes grow to a fixed share of the cache, as a growing array doubles, makes compactions geometrically
    rarer as the context grows (amortised O(1) copies per appended slot) while holes add at most that
    share to each forward's cache work; ``hole_budget`` keeps short caches from compacting every step.
    """
    return max(hole_budget, int(hole_share * slots))


class RaggedCache:
    """A dynamic key/value cache (``empty_cache(layer_class)``) plus the live-slot mask of every row.

    Use: ``forward_inputs(new_mask)`` gives the ``attention_mask``/``position_ids``/``cache`` for a forward
    that appends ``new_mask.shape[1]`` slots; after the forward, ``commit(keep_mask)`` says which of those
    slots hold tokens that stay.
    """

    def __init__(
        self, rows: int, device: torch.device, hole_budget: int, hole_share: float = HOLE_SHARE, layer_class: type[DynamicLayer] = GrowingLayer
    ):
        if hole_budget < 0:
            raise ValueError(f"hole_budget must be >= 0, got {hole_budget!r}")
        if not 0.0 <= hole_share < 1.0:
            raise ValueError(f"hole_share must be in [0, 1), got {hole_share!r}")
        self.cache = empty_cache(layer_class)
        self.layer_class = layer_class
        self.live = torch.zeros((rows, 0), dtype=torch.long, device=device)
        self.hole_budget = hole_budget
        self.hole_share = hole_share

    @property
    def lengths(self) -> torch.Tensor:
        """Live tokens per row, which is also the position id of the row's next token."""
        return self.live.sum(dim=1)

    @property
    def slots(self) -> int:
        """Slots on the cache's sequence axis (live or not)."""
        return self.live.shape[1]

    def forward_inputs(self, new_mask: torch.Tensor, position_ids: bool = True) -> dict:
        """Keyword arguments for a forward appending one slot per column of ``new_mask`` (1 = real token)."""
        new_mask = new_mask.long()
        inputs = {"attention_mask": torch.cat([self.live, new_mask], dim=1), "cache": self.cache, "use_cache": True}
        if position_ids:
            offsets = (new_mask.cumsum(dim=1) - 1).clamp_min(0)
            inputs["position_ids"] = self.lengths[:, None] + offsets
        return inputs

    def commit(self, keep_mask: torch.Tensor) -> None:
        """Record which of the slots appended by the last forward stay live, then reclaim holes."""
        self.live = torch.cat([self.live, keep_mask.long()], dim=1)
        self._reclaim()

    def rollback(self, speculative: int, keep: torch.Tensor) -> None:
        """Of the last ``speculative`` slots, keep the first ``keep[r]`` of each row live and drop the rest."""
        if speculative <= 0:
            return
        kept = torch.arange(speculative, device=self.live.device)[None, :] < keep[:, None]
        self.live = torch.cat([self.live[:, :-speculative], self.live[:, -speculative:] * kept], dim=1)
        self._reclaim()

    def _reclaim(self) -> None:
        self._crop_dead_tail()
        if self.live.shape[0] == 0:
            return
        if self.slots - int(self.lengths.max()) > hole_allowance(self.slots, self.hole_budget, self.hole_share):
            self.compact()

    def _crop_dead_tail(self) -> None:
        dead_tail = self.slots - last_live_column(self.live)
        if dead_tail > 0 and self.cache.get_seq_length() > 0:
            self.cache.crop(-dead_tail)
            self.live = self.live[:, : self.slots - dead_tail]

    def drop_finished(self, finished: torch.Tensor) -> None:
        """Follow the batch when the rows marked in ``finished`` (BoolTensor[R]) leave it, as after a
        step whose ``StepOutcome.finished`` has any: the loop and every stateful drafter call this."""
        if not bool(finished.any()):
            return
        rows = (~finished).nonzero().squeeze(1)
        # A GrowingLayer moves the kept rows down within its buffer (no slot gather, no new buffer).
        for layer in self.cache.layers:
            if layer.is_initialized:
                layer.batch_select_indices(rows.to(layer.keys.device))
        self.live = self.live[rows]
        self._reclaim()

    def compact(self) -> None:
        """Gather each row's live slots, left-padded, into a new cache."""
        width = int(self.lengths.max()) if self.live.shape[0] > 0 else 0
        # A stable sort on 0/1 puts each row's dead slots first and its live slots last, in order.
        order = torch.sort(self.live, dim=1, stable=True).indices[:, self.slots - width :]
        compacted = empty_cache(self.layer_class)
        for index, layer in enumerate(self.cache.layers if width > 0 else ()):
            keys, values = layer.keys, layer.values
            gather = order.to(keys.device)[:, None, :, None]
            compacted.update(
                keys.gather(2, gather.expand(keys.shape[0], keys.shape[1], width, keys.shape[3])),
                values.gather(2, gather.expand(values.shape[0], values.shape[1], width, values.shape[3])),
                index,
            )
        self.cache = compacted
        self.live = self.live.gather(1, order)
