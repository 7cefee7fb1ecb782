"""README's pictures, regenerated from a real study (benchmarks/README.md)."""
