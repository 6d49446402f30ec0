"""The one error type of the command line, and the short words for why a file failed."""

import errno

from ds4tui.errors import Ds4tuiError


class CliError(Ds4tuiError):
    """A user-facing failure: printed as one line on stderr, exit status 1."""


_REASONS = {errno.ENOENT: "no such file", errno.EISDIR: "is a directory", errno.EACCES: "permission denied",
            errno.EPERM: "permission denied", errno.ENOTDIR: "a part of the path is not a directory"}


def os_reason(exc: OSError) -> str:
    """Why an OSError happened, in a few lower-case words without the errno or the path
    (the message names the file once itself): "no such file", "is a directory"."""
    if exc.errno in _REASONS:
        return _REASONS[exc.errno]
    words = exc.strerror or str(exc)
    return words[:1].lower() + words[1:]
