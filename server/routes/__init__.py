"""Thin HTTP routers, one per concern."""
