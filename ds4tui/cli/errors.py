"""The one error type of the command line."""


class CliError(Exception):
    """A user-facing failure: printed as one line on stderr, exit status 1."""
