"""autotune against DeepSpeed's own autotuner, side by side on the same workload and ranks
(benchmarks/README.md)."""
