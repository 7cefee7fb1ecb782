"""The memory model's predictions against measured peaks (DeepSpeed, FSDP2, scripts), and
the tables of docs/plans.md (benchmarks/README.md)."""
