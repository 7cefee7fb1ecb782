"""What the loss check (autotune verify) costs against a study's budget (benchmarks/README.md)."""
