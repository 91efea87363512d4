"""Hand-run benchmarks (not part of the installed package); results in benchmarks/RESULTS.md."""
