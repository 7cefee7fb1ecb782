"""Measurements behind the activation dial: which blocks a share of them recomputes, and
what a selective recomputation costs (benchmarks/README.md)."""
