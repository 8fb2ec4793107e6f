"""``python -m cemlib.train ...``: the same command as ``cemlib train ...`` (:mod:`cemlib.train.cli`)."""

import sys

from cemlib.train.cli import main

sys.exit(main())
