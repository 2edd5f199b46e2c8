"""Evaluation: measure (bytes/token, BPB per head and source), and the report it never
imports (JSON, manifest figures, PNGs)."""
