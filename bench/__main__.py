"""`python -m bench ...` is `fleet-proxy bench ...`."""

import sys

from bench.cli import main

sys.exit(main(sys.argv[1:]))
