"""Pure routing logic: head profiles, device specs, the cost model, live state, policies.

Imports neither torch, numpy nor fastapi, so it stays fast to test and reusable.
"""
