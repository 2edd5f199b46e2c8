"""The HTTP edge: routes, request and response schemas, dependencies, middleware, and the
mapping of errors to OpenAI-style responses."""
