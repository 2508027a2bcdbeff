"""`python -m snapstore`: the command-line tool (see `snapstore.cli`)."""

import sys

from snapstore import cli

if __name__ == "__main__":
  sys.exit(cli.main())
