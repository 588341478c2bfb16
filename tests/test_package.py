"""The top-level ``dspark`` namespace: what ``import dspark`` exposes and what it costs."""

import subprocess
import sys


def _fresh(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` with this interpreter in a new process."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_all_names_resolve():
    """Every name in ``dspark.__all__``, ``pretrained`` included, is an attribute after a bare ``import dspark``."""
    completed = _fresh("import dspark\nfor name in dspark.__all__:\n    getattr(dspark, name)\nassert callable(dspark.pretrained.load)")
    assert completed.returncode == 0, completed.stderr


def test_pretrained_imported_on_first_use():
    """``import dspark`` leaves ``dspark.pretrained`` (transformers' model-loading stack) unimported until it is used."""
    completed = _fresh("import sys, dspark\nassert 'dspark.pretrained' not in sys.modules\ndspark.pretrained\nassert 'dspark.pretrained' in sys.modules")
    assert completed.returncode == 0, completed.stderr
