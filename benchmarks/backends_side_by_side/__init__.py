"""The best DeepSpeed and the best FSDP2 configuration of a workload, measured side by side
(benchmarks/README.md)."""
