"""Speed benchmarks: `make bench` (bench/run.py) and the one-question timings beside it."""
