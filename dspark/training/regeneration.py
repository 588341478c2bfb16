"""The target answers training prompts itself, so the drafter learns the target's own output.

``regenerate`` appends greedy and temperature-1 answers to a JSONL file and resumes an interrupted
run. Mode 'reference' adds the dataset's own answers as extra contexts (EAGLE-style fixed data):
cheap, since they need one target forward instead of hundreds, and the labels are still the
target's distributions there. ``frequent_tokens`` picks the reduced draft vocabulary from the answers.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dspark.training.data import PromptRecord

__all__ = ["MODES", "frequent_tokens", "read_sequences", "regenerate"]


MODES = ("greedy", "sample", "reference")


def regenerate(
    target,
    tokenizer,
    prompts: list[PromptRecord],
    output: str | Path,
    max_new_tokens: int = 256,
    modes: tuple[str, ...] = ("greedy", "sample"),
    batch_size: int = 8,
    max_prompt_tokens: int = 512,
    seed: int = 0,
    progress=None,
) -> Path:
    """Append the target's own answers to ``output`` (JSONL: id, mode, prompt_ids, response_ids, and
    for generated answers the dtype of the model that wrote them).

    Prompts already in ``output`` for a mode are skipped, so an interrupted run resumes; prompts longer
    than ``max_prompt_tokens`` after the chat template are skipped too. 'sample' draws at temperature 1
    with no truncation; 'reference' writes the dataset's answer as the assistant turn (no generation,
    at most ``max_new_tokens`` tokens; prompts without one are skipped). ``progress``: tqdm-like bar.
    """
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    done = {(record["id"], record["mode"]) for record in read_sequences(output)} if output.exists() else set()
    tokenizer.padding_side = "left"
    device = target.get_input_embeddings().weight.device  # prompts are encoded on the CPU, answered there
    dtype = str(target.get_input_embeddings().weight.dtype).removeprefix("torch.")
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"modes must be among {MODES}, got {mode!r}")
        pending = [prompt for prompt in prompts if (prompt.id, mode) not in done and (mode != "reference" or prompt.reference)]
        texts = {
            prompt.id: tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}], add_generation_prompt=True, tokenize=False)
            for prompt in pending
        }
        lengths = {key: len(tokenizer(text, add_special_tokens=False)["input_ids"]) for key, text in texts.items()}
        # Prompts over the limit are skipped, not truncated (a cut chat template loses its generation prompt).
        # Similar lengths share a batch so little compute goes to padding, but only within windows of the
        # interleaved order: a global sort would spend an interrupted run on one source's short prompts.
        pending = [p for p in pending if lengths[p.id] <= max_prompt_tokens]
        if mode == "reference":
            _write_references(tokenizer, pending, texts, output, max_new_tokens, target.generation_config.eos_token_id, progress)
            continue
        window = 8 * batch_size
        pending = [p for start in range(0, len(pending), window) for p in sorted(pending[start : start + window], key=lambda p: lengths[p.id])]
        for start in range(0, len(pending), batch_size):
            batch = pending[start : start + batch_size]
            encoded = tokenizer([texts[p.id] for p in batch], return_tensors="pt", padding=True, add_special_tokens=False)
            torch.manual_seed(seed + start)
            sampling = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if mode == "sample" else {"do_sample": False}
            on_device = {key: value.to(device) for key, value in encoded.items()}
            with torch.inference_mode():
                sequences = target.generate(**on_device, max_new_tokens=max_new_tokens, **sampling).cpu()
            with output.open("a") as handle:
                for row, prompt in enumerate(batch):
                    prompt_ids = encoded["input_ids"][row][encoded["attention_mask"][row].bool()].tolist()
                    response = sequences[row, encoded["input_ids"].shape[1] :].tolist()
                    response = _until_eos(response, target.generation_config.eos_token_id)
                    record = {"id": prompt.id, "mode": mode, "prompt_ids": prompt_ids, "response_ids": response, "dtype": dtype}
                    handle.write(json.dumps(record) + "\n")
            if progress is not None:
                progress.update(len(batch))
    return output


def _write_references(tokenizer, prompts: list[PromptRecord], texts: dict[str, str], output: Path, max_new_tokens: int, eos, progress) -> None:
    """Each prompt's dataset answer, rendered as the assistant turn by the chat template, up to its EOS."""
    with output.open("a") as handle:
        for prompt in prompts:
            conversation = [{"role": "user", "content": prompt.text}, {"role": "assistant", "content": prompt.reference}]
            full = tokenizer.apply_chat_template(conversation, tokenize=False)
            if not full.startswith(texts[prompt.id]):
                raise ValueError(f"the chat template of {type(tokenizer).__name__} does not extend the generation prompt with the answer")
            prompt_ids = tokenizer(texts[prompt.id], add_special_tokens=False)["input_ids"]
            response_ids = _until_eos(tokenizer(full[len(texts[prompt.id]) :], add_special_tokens=False)["input_ids"], eos)[:max_new_tokens]
            handle.write(json.dumps({"id": prompt.id, "mode": "reference", "prompt_ids": prompt_ids, "response_ids": response_ids}) + "\n")
            if progress is not None:
                progress.update(1)


def _until_eos(tokens: list[int], eos) -> list[int]:
    eos_ids = {eos} if isinstance(eos, int) else set(eos or ())
    for index, token in enumerate(tokens):
        if token in eos_ids:
            return tokens[: index + 1]
    return tokens


def read_sequences(path: str | Path) -> list[dict]:
    """The records of a regenerated JSONL file (a torn last line from an interruption is skipped)."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def frequent_tokens(records: list[dict], size: int, vocab_size: int, then: list[dict] | None = None) -> torch.Tensor:
    """The ``size`` token ids most frequent in the responses of ``records``, sorted; tokens equally
    frequent there (such as those never seen) are ranked by their frequency in ``then``'s responses,
    then by lower id.

    This is the reduced draft vocabulary (FR-Spec style): the drafter proposes only these tokens.
    """
    if not 1 <= size <= vocab_size:
        raise ValueError(f"size must be in [1, {vocab_size}], got {size!r}")

    def counts_in(group: list[dict]) -> torch.Tensor:
        counts = torch.zeros(vocab_size, dtype=torch.long)
        for record in group:
            counts += torch.bincount(torch.tensor(record["response_ids"], dtype=torch.long), minlength=vocab_size)
        return counts

    secondary = counts_in(then or [])
    order = torch.argsort(-(counts_in(records) * (int(secondary.max()) + 1) + secondary), stable=True)
    return order[:size].sort().values
