"""The files heads/ ships (named in files.py) and their attribution (README.md)."""
