"""Helpers shared by the benchmark scripts: prompt encoding, output trimming, atomic JSON reports."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

__all__ = ["encode_chat", "generated_tokens", "write_json"]


def encode_chat(tokenizer, messages: list[str]) -> dict:
    """Chat-templated user messages, left-padded into one batch."""
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True, tokenize=False) for m in messages]
    # The template already holds the special tokens; adding them again would change the prompt.
    encoded = tokenizer(texts, padding=True, add_special_tokens=False, return_tensors="pt")
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}


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
