"""The request lifecycle: plan (validate, tokenize, route) -> admit (client limits, KV) ->
run (stream, account), and the pieces it is made of."""
