class CliError(Exception):
    """A user-facing failure: printed as one line, exit status 2."""
