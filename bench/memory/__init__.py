"""Memory benchmarks: peak memory per stage, phase, rank and device (`make bench-memory`)."""
