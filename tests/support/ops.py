"""DeepSpeed's built ops, copied between op caches."""

from __future__ import annotations

import os


def copy_built_ops(
    source_root: str, target_root: str, only: tuple[str, ...] | None = None
) -> list[str]:
    """Copy each op ``source_root`` has built (of ``only``, if given) to ``target_root``
    where that op is not built yet; returns the ops copied. torch's op folders are
    relocatable (ninja's outputs are relative to the folder) and the copy keeps modification
    times, so ninja finds the copy up to date. Each copy is made under the target op's lock
    and moved into place whole."""
    import glob
    import shutil

    from autotune.backends.deepspeed._op_locks import op_lock

    copied = []
    if not os.path.isdir(source_root):
        return copied
    for op in sorted(os.listdir(source_root)):
        source = os.path.join(source_root, op)
        if only is not None and op not in only:
            continue
        if not os.path.isdir(source) or not glob.glob(os.path.join(source, "*.so")):
            continue
        target = os.path.join(target_root, op)
        with op_lock(target_root, op):
            if glob.glob(os.path.join(target, "*.so")):
                continue
            staging = f"{target}.copying"
            shutil.rmtree(staging, ignore_errors=True)
            shutil.copytree(source, staging, ignore=shutil.ignore_patterns("lock"))
            shutil.rmtree(target, ignore_errors=True)  # a build a killed process left unfinished
            os.replace(staging, target)
        copied.append(op)
    return copied
