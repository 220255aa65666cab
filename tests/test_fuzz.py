"""A bounded schemathesis run over /openapi.json, as part of the suite (docs/reliability.md).

`benchmarks/fuzz_api.py` starts its own real server with the real Gemma in a throwaway cache,
offline, and checks every response: no 5xx, documented status and content type, the documented
schema, schema-violating input refused, no filesystem path unless asked for. Longer runs
(`--examples 100`, `--all-prefixes`) are for the benchmark itself; here a few cases per
operation keep the suite quick while every operation is still exercised.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_fuzzing_every_operation_finds_no_5xx_and_no_schema_violation():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fuzz_api.py"), "--examples", "15"],
                          capture_output=True, text=True, timeout=1200, cwd=ROOT)
    report = proc.stdout[-6000:] + "\n" + proc.stderr[-3000:]
    assert proc.returncode == 0, report
    figures = next(line for line in proc.stdout.splitlines() if line.startswith("operations fuzzed:"))
    assert "5xx: 0 " in figures and figures.endswith("violations: 0"), report
    assert int(figures.split()[2]) > 50  # every operation was reached, not just a few
