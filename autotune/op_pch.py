"""A precompiled torch header for the JIT build of a DeepSpeed op with many torch sources.

Each C++ source of an op that includes torch's extension header parses that header again:
~28 s of CPU per source on this project's 2-core test machine (torch 2.13, ``-std=c++20``,
no ``-g``), against ~1 s for a source without it. GCC's precompiled header
(https://gcc.gnu.org/onlinedocs/gcc/Precompiled-Headers.html) parses it once (~47 s) and
each source then loads it (~9.5 s). That pays off from :data:`MIN_TORCH_SOURCES` sources:
with two compile jobs, ``n`` sources take ``n / 2 * 28`` s of wall time without it and
``47 + n / 2 * 9.5`` s with it. DeepSpeed's async I/O op (NVMe offload) has 9; its Adam
and communication ops have two each and are built as torch builds them.

torch runs ninja with the compiler ``CXX`` names. For such an op, :func:`compiling` names a
wrapper script (``<op folder root>/autotune-pch/<compiler digest>/g++``, which runs this
file) while the op loads: a torch source is compiled with ``-include`` of a header built,
once per op and set of flags, with that source's own flags (GCC takes a ``.gch`` only for
the flags it was built with); every other command runs the compiler unchanged. When the
header does not build or the compile with it fails, the source is compiled as torch would
have: the header changes how fast the op builds, not whether it builds. Every load of the
op names the same wrapper, so ninja sees the same command and does not rebuild. The
``.gch`` (~800 MB) is removed when the load returns.

This file is run as a script by the wrapper (one process per compile command), so it
imports only the standard library.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

MIN_TORCH_SOURCES = 6
FOLDER = "autotune-pch"
HEADER = "torch_ext.h"
HEADER_TEXT = "#include <torch/extension.h>\n"
FAILED = "failed.log"  # the header did not build: the op's other sources do not try again
REAL_CXX_VARIABLE = "AUTOTUNE_PCH_CXX"  # the compiler the wrapper runs
OP_FOLDER_VARIABLE = "AUTOTUNE_PCH_DIR"  # where the wrapper keeps its headers
SOURCE_SUFFIXES = (".cpp", ".cc", ".cxx")
TORCH_INCLUDES = ("torch/", "ATen/", "c10/")
_INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.MULTILINE)


def includes_torch(source: str, include_dirs: list[str], _seen: set[str] | None = None) -> bool:
    """Whether ``source`` includes a torch header, itself or through the quoted headers it
    includes (looked up beside the including file, then in ``include_dirs``)."""
    seen = _seen if _seen is not None else set()
    path = os.path.realpath(source)
    if path in seen:
        return False
    seen.add(path)
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return False
    for bracket, name in _INCLUDE.findall(text):
        if name.startswith(TORCH_INCLUDES):
            return True
        if bracket != '"':
            continue
        for folder in (os.path.dirname(path), *include_dirs):
            candidate = os.path.join(folder, name)
            if os.path.isfile(candidate):
                if includes_torch(candidate, include_dirs, seen):
                    return True
                break
    return False


def torch_source_count(builder: Any) -> int:
    """How many of a DeepSpeed op builder's C++ sources include torch."""
    include_dirs = [builder.deepspeed_src_path(path) for path in builder.include_paths()]
    sources = [builder.deepspeed_src_path(path) for path in builder.sources()]
    return sum(
        1
        for source in sources
        if source.endswith(SOURCE_SUFFIXES) and includes_torch(source, include_dirs)
    )


def wrapper_path(root: str, real_cxx: str) -> str:
    """The wrapper for compiler ``real_cxx`` under op folder ``root``; its name ends in
    ``g++``, which torch's compiler check accepts."""
    resolved = shutil.which(real_cxx) or real_cxx
    digest = hashlib.sha1(os.path.realpath(resolved).encode()).hexdigest()[:12]
    return os.path.join(root, FOLDER, digest, "g++")


def write_wrapper(root: str, real_cxx: str) -> str:
    """Write (or refresh) the wrapper script for ``real_cxx``; returns its path."""
    path = wrapper_path(root, real_cxx)
    script = (
        "#!/bin/sh\n"
        "# autotune: compiles torch sources with a precompiled torch header (autotune/op_pch.py)\n"
        f"{REAL_CXX_VARIABLE}={shlex.quote(real_cxx)} "
        f"{OP_FOLDER_VARIABLE}={shlex.quote(os.path.join(root, FOLDER))} "
        f'exec {shlex.quote(sys.executable)} {shlex.quote(os.path.abspath(__file__))} "$@"\n'
    )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with contextlib.suppress(OSError), open(path, encoding="utf-8") as existing:
        if existing.read() == script:
            return path
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(script)
    os.chmod(temporary, 0o755)
    os.replace(temporary, path)
    return path


@contextlib.contextmanager
def compiling(builder: Any, root: str) -> Iterator[bool]:
    """While an op loads: the wrapper as torch's compiler when the op has
    :data:`MIN_TORCH_SOURCES` torch sources or more (yields whether), and its headers
    removed afterwards."""
    try:
        wanted = torch_source_count(builder) >= MIN_TORCH_SOURCES
    except Exception:  # noqa: BLE001 - an op builder of another DeepSpeed: build as torch does
        wanted = False
    if not wanted:
        yield False
        return
    before = os.environ.get("CXX")
    os.environ["CXX"] = write_wrapper(root, before or "c++")
    try:
        yield True
    finally:
        if before is None:
            os.environ.pop("CXX", None)
        else:
            os.environ["CXX"] = before
        remove_headers(root, builder.name)


def _headers_dir(folder: str, op: str) -> str:
    """Where ``op``'s precompiled headers are built, under the wrapper's ``folder``."""
    return os.path.join(folder, "headers", op)


def remove_headers(root: str, op: str) -> None:
    """Remove the precompiled headers of ``op``'s build (~800 MB each)."""
    shutil.rmtree(_headers_dir(os.path.join(root, FOLDER), op), ignore_errors=True)


class Compile:
    """One compile command of ninja's: ``CXX -MMD -MF DEP FLAGS -c SOURCE -o OBJECT``."""

    def __init__(self, args: list[str]) -> None:
        self.args = args
        self.source = self._after("-c")
        self.object = self._after("-o")
        self.depfile = self._after("-MF")

    def _after(self, flag: str) -> str | None:
        if flag in self.args[:-1]:
            return self.args[self.args.index(flag) + 1]
        return None

    def is_torch_source(self) -> bool:
        if self.source is None or self.object is None or not self.source.endswith(SOURCE_SUFFIXES):
            return False
        include_dirs = [arg[2:] for arg in self.args if arg.startswith("-I") and len(arg) > 2]
        return includes_torch(self.source, include_dirs)

    def header_flags(self) -> list[str]:
        """The command's flags without its input, output and dependency file: what the
        header is built with."""
        dropped = {"-c", "-o", "-MF", "-MMD"}
        flags, skip = [], False
        for arg in self.args:
            if skip:
                skip = False
                continue
            if arg in dropped:
                skip = arg != "-MMD"
                continue
            flags.append(arg)
        return flags

    def op_name(self) -> str:
        for arg in self.args:
            if arg.startswith("-DTORCH_EXTENSION_NAME="):
                return re.sub(r"[^A-Za-z0-9_.-]", "_", arg.split("=", 1)[1]) or "op"
        return "op"


def header_for(real_cxx: str, folder: str, command: Compile) -> str | None:
    """The header to ``-include`` for ``command``, its ``.gch`` built beside it if none
    is yet (one process builds it, the others wait for it), or None where it cannot be."""
    flags = command.header_flags()
    key = hashlib.sha1(json.dumps([real_cxx, *flags]).encode()).hexdigest()[:16]
    directory = os.path.join(_headers_dir(folder, command.op_name()), key)
    header = os.path.join(directory, HEADER)
    try:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if os.path.exists(os.path.join(directory, FAILED)):
                return None
            if os.path.exists(f"{header}.gch"):
                return header
            with open(header, "w", encoding="utf-8") as text:
                text.write(HEADER_TEXT)
            partial = f"{header}.gch.{os.getpid()}.tmp"
            built = subprocess.run(
                [real_cxx, *flags, "-x", "c++-header", header, "-o", partial],
                capture_output=True,
                text=True,
            )
            if built.returncode != 0:
                with open(os.path.join(directory, FAILED), "w", encoding="utf-8") as log:
                    log.write(built.stdout + built.stderr)
                with contextlib.suppress(OSError):
                    os.remove(partial)
                return None
            os.replace(partial, f"{header}.gch")
            return header
    except OSError:
        return None


def _drop_from_depfile(depfile: str | None, folder: str) -> None:
    """Keep the header out of the object's dependencies: it is removed after the build,
    and ninja rebuilds an object whose dependency is missing."""
    if not depfile:
        return
    with contextlib.suppress(OSError):
        with open(depfile, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
        kept = [line for line in lines if folder not in line]
        if len(kept) != len(lines):
            if kept and kept[-1].endswith("\\"):
                kept[-1] = kept[-1][:-1].rstrip()
            with open(depfile, "w", encoding="utf-8") as handle:
                handle.write("\n".join(kept) + "\n")


def main(argv: list[str]) -> int:
    """The wrapper: compile a torch source with the header, anything else as asked."""
    real_cxx = os.environ.get(REAL_CXX_VARIABLE) or "c++"
    folder = os.environ.get(OP_FOLDER_VARIABLE)
    command = Compile(argv)
    if folder and command.is_torch_source():
        header = header_for(real_cxx, folder, command)
        if header is not None:
            done = subprocess.run(
                [real_cxx, *argv, "-include", header, "-Winvalid-pch"],
                capture_output=True,
                text=True,
            )
            if done.returncode == 0:
                _drop_from_depfile(command.depfile, folder)
                sys.stdout.write(done.stdout)
                sys.stderr.write(done.stderr)
                return 0
    os.execvp(real_cxx, [real_cxx, *argv])
    return 1  # pragma: no cover - execvp does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
