"""CLI subcommands, one module per command group. Each exposes `register(subparsers)`.

Modules import heavy dependencies (torch, uvicorn, matplotlib) inside their handlers, so
`polyhead --help` stays fast.
"""
