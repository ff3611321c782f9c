"""`python -m farmem`: the same entry point as the installed `farmem` script."""

import sys

from farmem.main import cli

if __name__ == "__main__":
    sys.exit(cli())
