"""router must load without torch, numpy or fastapi (fast tests, reusable decision logic)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
import router, router.router, router.cost, router.policy.build, router.state
import kernels.devices, kernels.crossover, kernels.selector
import router.admission, router.step_time_fit, router.store, router.decisions
import router.simulate.compare, router.simulate.engine, router.simulate.traces
import router.planner, router.planner.plan, router.planner.forecast, router.planner.bpt
heavy = sorted(m for m in ("torch", "numpy", "fastapi", "matplotlib", "redis")
               if m in sys.modules)
assert not heavy, heavy
"""


def test_router_imports_no_heavy_packages() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
