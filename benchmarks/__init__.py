"""The benchmarks and the GPU check, one folder per tool (benchmarks/README.md lists them),
importable from the repository root as ``benchmarks.TOOL.x`` (the tests import them so).
Most are scripts run by path (``python benchmarks/TOOL/x.py``), which put the repository
root on ``sys.path``; the GPU check is the package ``benchmarks.gpu_check``. Shared here:
``workloads.py`` and ``spaces/`` (the tables name them by path), ``probe_jobs.py`` and
``autotune_cli.py``. Nothing is imported here: the GPU check's driver imports this package
before anything is installed.
"""
