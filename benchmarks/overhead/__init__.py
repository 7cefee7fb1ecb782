"""What a probe costs beyond its timed steps: per-trial overhead, warm ranks, a probe's
launch (benchmarks/README.md)."""
