"""Issue 6, item 1: the workloads of benchmarks/throughput.py run against Huey, RQ and task-spooler
as well as fredica-worker, in one run (`python3 benchmarks/peers/run.py`; see benchmarks/README.md)."""
