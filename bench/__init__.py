"""Benchmarks (run by scripts/bench); numbers are ratios against alternatives in the same run."""
