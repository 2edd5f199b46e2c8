"""Lifecycle planner: C_lifecycle(V) per candidate vocabulary for a deployment forecast, the
optimal V, and the break-even λ at which each candidate overtakes the training optimum.

Pure Python; the YAML loader and the plot live in server/commands/plan.py.
"""

from router.planner.forecast import Forecast, Regime, parse_forecast
from router.planner.plan import Line, ScopePlan, VocabPlan, plan

__all__ = ["Forecast", "Line", "Regime", "ScopePlan", "VocabPlan", "parse_forecast", "plan"]
