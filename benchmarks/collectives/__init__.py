"""What the collectives of CPU ranks (gloo) cost per byte: the cost model's rates
(benchmarks/README.md)."""
