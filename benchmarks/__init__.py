"""The benchmarks and the GPU check, importable from the repository root as ``benchmarks.x``
(the tests import them so). Most are scripts run by path (``python benchmarks/x.py``);
the GPU check is the package ``benchmarks.gpu_check``. Nothing is imported here: the GPU
check's driver imports this package before anything is installed.
"""
