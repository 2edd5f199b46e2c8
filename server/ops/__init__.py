"""Operations around the request path: auth, audit, rate limits, Redis state, metrics,
tracing, logging and readiness."""
