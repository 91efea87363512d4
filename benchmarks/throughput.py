#!/usr/bin/env python3
"""Throughput and latency of the in-process Supervisor, run by hand (code: benchmarks/_throughput.py).

    python3 benchmarks/throughput.py                       # forkserver (the default start method)
    python3 benchmarks/throughput.py --start-method spawn  # for comparison
    python3 benchmarks/throughput.py --help                # workload sizes, --only, experiments

This file is deliberately tiny. multiprocessing re-runs the parent's main script, as `__mp_main__`,
in every forkserver and spawn child before the child does anything else (Python 3.11 never hands
`main_path` to the forkserver, so preloading "__main__" would not help either; only a
`python -m package` main such as `python3 -m daemon` is exempt). A 450-line script costs each child
~4 ms just to compile, and its imports (argparse, statistics, tempfile, sqlite3, ...) ~8 ms: that
would be the benchmark measuring itself.

`--main-imports MODULES` makes that re-run import what a real entry point would (the `fredica`
console script runs `from daemon.cli import main` at its top level). The module list travels in
FREDICA_BENCH_MAIN_IMPORTS, which the forkserver and every child inherit.
"""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if os.environ.get("FREDICA_BENCH_MAIN_IMPORTS"):  # in the parent and, re-run, in every child
    import importlib

    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    for _name in os.environ["FREDICA_BENCH_MAIN_IMPORTS"].split(","):
        importlib.import_module(_name)

if __name__ == "__main__":
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from benchmarks._throughput import main

    sys.exit(main())
