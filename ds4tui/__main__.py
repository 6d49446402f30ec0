"""`python -m ds4tui` is the `ds4tui` command."""

import sys

from ds4tui.cli import main

if __name__ == "__main__":
    sys.exit(main())
