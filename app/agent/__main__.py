"""``python -m tailguard.agent`` = ``tailguard diagnose``."""

import sys

from tailguard.agent.cli import main

raise SystemExit(main(sys.argv[1:]))
