"""``python -m app.agent`` = ``tailguard diagnose``."""

import sys

from app.agent.cli import main

raise SystemExit(main(sys.argv[1:]))
