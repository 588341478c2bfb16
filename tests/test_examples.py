"""Every script in examples/ runs as written, in a fresh interpreter, from a scratch directory."""

from pathlib import Path

import pytest

from tests.conftest import DATA_DIR
from tests.fresh_python import run_script

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.py"))


def test_examples_found():
    """The glob finds the examples, so the parametrized test below cannot pass by running nothing."""
    assert any(path.name == "quickstart.py" for path in EXAMPLES)


@pytest.mark.integration
@pytest.mark.parametrize("script", EXAMPLES, ids=[path.name for path in EXAMPLES])
def test_example_runs(script, tmp_path):
    """The example exits 0 when run with this interpreter from an empty directory."""
    if "DATA_DIR" in script.read_text() and not DATA_DIR.is_dir():
        pytest.skip("the example reads the prompt sets in shared/data, which are not beside this checkout")
    run_script(script, cwd=tmp_path)
