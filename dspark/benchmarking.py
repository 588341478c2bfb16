"""Helpers the benchmark scripts share: output trimming and comparison, atomic JSON reports, and
timing a strategy over prompts (prompts are encoded with ``dspark.pretrained.encode_chat``).

They live in the package (not next to the scripts) so that every script imports them the same
way, with no ``sys.path`` edits.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

import dspark

__all__ = ["across_categories", "first_difference", "generated_tokens", "run_strategy", "sweep", "write_json"]


def across_categories(prompts: list) -> list:
    """``prompts`` (each with a ``category``) reordered round-robin over their categories, so that every batch,
    and the first rows of a small one, mix categories rather than take one category's prompts."""
    categories = list(dict.fromkeys(prompt.category for prompt in prompts))
    rank = {}
    ordered = []
    for prompt in prompts:
        rank[prompt.category] = rank.get(prompt.category, -1) + 1
        ordered.append((rank[prompt.category], categories.index(prompt.category), prompt))
    return [prompt for *_, prompt in sorted(ordered, key=lambda item: item[:2])]


def generated_tokens(sequences: torch.Tensor, prompt_length: int, eos_token_id: int) -> list[list[int]]:
    """Each row's new tokens up to and including its first EOS (HF stops there, dspark pads after it)."""
    rows = []
    for row in sequences[:, prompt_length:].tolist():
        rows.append(row[: row.index(eos_token_id) + 1] if eos_token_id in row else row)
    return rows


def write_json(path: Path, report: dict) -> None:
    """Write through a temporary file so an interrupted run never leaves half a report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(partial, path)


def first_difference(tokens: list[int], reference: list[int]) -> int | None:
    """Index of the first differing token (or of the shorter sequence's end), None when equal."""
    if tokens == reference:
        return None
    return next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), min(len(tokens), len(reference)))


def run_strategy(model, strategy, prompts, max_new_tokens) -> dict:
    """Generate every prompt; return tokens/s, τ, the share of steps that verified a draft, and the
    median plain (ℓ = 0) and verifying step times in ms."""
    speculative = dspark.SpeculativeModel(model, strategy)
    tokens = seconds = 0.0
    plain, verifying, row_steps = [], [], 0
    for prompt in prompts:
        started = time.perf_counter()
        result = speculative.generate(**prompt, max_new_tokens=max_new_tokens)
        seconds += time.perf_counter() - started
        tokens += result.stats.new_tokens
        row_steps += result.stats.steps
        for record in result.stats.records:
            (verifying if int(record.verify_lengths.max()) > 0 else plain).append(record.verify_seconds)
    return {
        "tokens_per_s": tokens / seconds,
        "tau": tokens / row_steps,
        "verify_share": len(verifying) / max(row_steps, 1),
        "plain_step_ms": 1000 * statistics.median(plain) if plain else None,
        "verify_step_ms": 1000 * statistics.median(verifying) if verifying else None,
    }


def sweep(model, settings: list[tuple[str, object]], prompts, max_new_tokens) -> dict:
    """``run_strategy`` every (name, strategy) after one warm-up call; the first setting is the baseline that
    every ``vs_autoregressive`` ratio divides by."""
    dspark.SpeculativeModel(model, settings[-1][1]).generate(**prompts[0], max_new_tokens=4)
    results = {}
    for name, strategy in tqdm(settings, desc="settings"):
        results[name] = run_strategy(model, strategy, prompts, max_new_tokens)
        results[name]["vs_autoregressive"] = results[name]["tokens_per_s"] / results[settings[0][0]]["tokens_per_s"]
        tqdm.write(f"{name:28s} {results[name]['tokens_per_s']:6.2f} tok/s  x{results[name]['vs_autoregressive']:.2f}  tau {results[name]['tau']:.2f}")
    return results
