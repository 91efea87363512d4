#!/usr/bin/env python3
"""fredica on PostgreSQL beside procrastinate on the same server (issue 15); code: benchmarks/postgres/_run.py.

    python3 benchmarks/postgres/run.py            # everything, ~15-20 minutes on 2 cores
    python3 benchmarks/postgres/run.py --help     # sizes, repetitions, parts, --fsync-off

A launcher, as benchmarks/peers/run.py: the daemons and workers it measures are subprocesses.
"""

import os
import sys

if __name__ == "__main__":
    REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from benchmarks.postgres._run import main

    sys.exit(main())
