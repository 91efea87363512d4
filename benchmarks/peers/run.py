#!/usr/bin/env python3
"""fredica-worker side by side with Huey, RQ and task-spooler (issue 6); code: benchmarks/peers/_run.py.

    python3 benchmarks/peers/run.py            # everything, ~8-10 minutes on 2 cores
    python3 benchmarks/peers/run.py --help     # sizes, repetitions, --only SYSTEMS

Tiny for the reason benchmarks/throughput.py gives: multiprocessing re-runs the main script in the
forkserver and in every fredica executor child, so anything imported here would be paid per task.
"""

import os
import sys

if __name__ == "__main__":
    REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from benchmarks.peers._run import main

    sys.exit(main())
