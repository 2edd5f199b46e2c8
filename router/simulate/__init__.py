"""Trace simulator: replay arrivals through the real Router and Admission, with engine step
times from the cost model, and compare policies against every static head."""
