"""Run a Python script in a fresh interpreter, as a user would, and fail the test with its stderr if it does not exit 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# Generous for a loaded 2-core CPU: the first SmolLM2 load also converts the model (about half a minute).
TIMEOUT_S = 600


def run_script(script: Path, cwd: Path, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """``sys.executable script`` with ``cwd`` as working directory and the test's environment (so the model cache is shared)."""
    try:
        completed = subprocess.run([sys.executable, str(script)], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        stderr = error.stderr.decode(errors="replace") if isinstance(error.stderr, bytes) else error.stderr or ""
        pytest.fail(f"{script} ran past {timeout} s; stderr:\n{stderr[-4000:]}")
    if completed.returncode != 0:
        pytest.fail(f"{script} exited with {completed.returncode}; stderr:\n{completed.stderr[-8000:]}")
    return completed
