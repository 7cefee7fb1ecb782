"""Training backends: what is specific to one training library (its config, its ops,
its engine on the rank, its memory terms, its export files)."""
