"""The bundle for a lent GPU machine in benchmarks/gpu_prepare.py: parts that fit a call, and their round trip."""

import zipfile

import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def gpu_prepare():
    """The script, imported as a module."""
    return load_script("gpu_prepare")


def test_part_sizes_fill_each_part_but_the_last(gpu_prepare):
    """A total is cut into full parts and a remainder; sizes that cannot be cut are refused by name."""
    assert gpu_prepare.part_sizes(10, 4) == [4, 4, 2]
    assert gpu_prepare.part_sizes(8, 4) == [4, 4]
    assert gpu_prepare.part_sizes(3, 4) == [3]
    with pytest.raises(ValueError, match="capacity_bytes.*-5"):
        gpu_prepare.part_sizes(10, -5)
    with pytest.raises(ValueError, match="total_bytes"):
        gpu_prepare.part_sizes(0, 4)
    with pytest.raises(TypeError, match="capacity_bytes"):
        gpu_prepare.part_sizes(10, 4.0)


def _members(tmp_path):
    """A wheel, a model file and a data folder, as the bundle holds them."""
    wheels = tmp_path / "in" / "wheels"
    wheels.mkdir(parents=True)
    with zipfile.ZipFile(wheels / "demo-1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("demo/__init__.py", "VALUE = 3\n")
    model = tmp_path / "in" / "weights.gguf"
    model.write_bytes(bytes(range(256)) * 300)
    data = tmp_path / "in" / "train"
    data.mkdir()
    (data / "prompts.jsonl").write_text('{"prompt": "hi"}\n')
    return {"wheels": wheels, "model/weights.gguf": model, "data/train": data}


def test_bundle_round_trip_unpacks_files_and_wheels(gpu_prepare, tmp_path):
    """Parts within the capacity join back into the same files, and every wheel is unzipped into site/."""
    parts = gpu_prepare.write_bundle(_members(tmp_path), tmp_path / "out", capacity_bytes=20_000)
    assert len(parts) > 1 and all(part.stat().st_size <= 20_000 for part in parts)
    destination = gpu_prepare.unpack(tmp_path / "out", tmp_path / "device")
    assert (destination / "model" / "weights.gguf").read_bytes() == bytes(range(256)) * 300
    assert (destination / "data" / "train" / "prompts.jsonl").read_text() == '{"prompt": "hi"}\n'
    assert (destination / "site" / "demo" / "__init__.py").read_text() == "VALUE = 3\n"


def test_unpack_refuses_a_missing_part(gpu_prepare, tmp_path):
    """A part lost between calls fails the checksum, naming the parts that were there."""
    parts = gpu_prepare.write_bundle(_members(tmp_path), tmp_path / "out", capacity_bytes=20_000)
    parts[1].unlink()
    with pytest.raises(ValueError, match="bundle.00.*do not match bundle.sha256"):
        gpu_prepare.unpack(tmp_path / "out", tmp_path / "device")


def test_device_calls_carry_one_part_each_then_check_then_train(gpu_prepare, tmp_path):
    """One call per part; the last also carries the checksum and runs gpu_check, and gpu_train gets its own call."""
    parts = [tmp_path / ".gpu" / f"bundle.{index:02d}" for index in range(3)]
    calls = gpu_prepare.device_calls(parts, tmp_path, "drafter/dir", 480)
    assert [call["carry"] for call in calls] == [[".gpu/bundle.00"], [".gpu/bundle.01"], [".gpu/bundle.02", ".gpu/bundle.sha256"], []]
    assert "gpu_check.py" in calls[2]["command"] and "--unpack" in calls[2]["command"] and "--drafter drafter/dir" in calls[2]["command"]
    assert "gpu_train.py" in calls[3]["command"] and "--budget-seconds 480" in calls[3]["command"]
    assert all("USE_HUB_KERNELS=NO" in call["command"] for call in calls[2:])
    assert all(len(call["command"]) <= 2000 for call in calls)
