"""How well a study predicts a world size it never probed (benchmarks/README.md)."""
