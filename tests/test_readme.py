"""Every ```python block of README.md is a complete program that runs as written from a scratch directory."""

import re
from pathlib import Path

import pytest

from tests.fresh_python import run_script

README = Path(__file__).resolve().parents[1] / "README.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _python_blocks() -> list[tuple[int, str]]:
    """(line number of the opening fence, code) for each ```python block."""
    text = README.read_text()
    return [(text.count("\n", 0, match.start()) + 1, match.group(1)) for match in _BLOCK.finditer(text)]


BLOCKS = _python_blocks()


def test_readme_blocks_found():
    """The README has Python blocks to run, so the parametrized test below cannot pass by running nothing."""
    assert len(BLOCKS) >= 2


@pytest.mark.integration
@pytest.mark.parametrize("line, code", BLOCKS, ids=[f"README.md:{line}" for line, _ in BLOCKS])
def test_readme_block_runs(line, code, tmp_path):
    """The block, saved alone as a script, exits 0 when run with this interpreter from an empty directory."""
    script = tmp_path / f"readme_line_{line}.py"
    script.write_text(code)
    run_script(script, cwd=tmp_path)
