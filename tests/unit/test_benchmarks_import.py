"""Every benchmark script still starts: CI runs none of them, so a helper that moves (a fixture that
leaves tests/conftest.py, a module renamed by a refactor) would otherwise break one unseen until the
next person measures with it (benchmarks/bench_classify.py once sat broken that way)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_benchmark_module_imports():
    names = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "__init__")
    assert len(names) > 10
    # one fresh interpreter for all of them: the test process's own imports must not hide a missing one
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module('benchmarks.' + name)\n"
    done = subprocess.run([sys.executable, "-c", code, *names], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
