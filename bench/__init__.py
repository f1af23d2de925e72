"""Benchmarks of the rlhf library (not tests): `make bench` runs bench/run.py."""
