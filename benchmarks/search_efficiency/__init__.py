"""Search efficiency: search strategies replayed against exhaustive tables measured on CPU
ranks, the ideal search that bounds them, and live short studies (benchmarks/README.md)."""
