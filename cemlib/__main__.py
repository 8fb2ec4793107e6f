"""``python -m cemlib train ...`` / ``python -m cemlib generate ...``: the ``cemlib`` command."""

import sys

from cemlib.cli import main

sys.exit(main())
