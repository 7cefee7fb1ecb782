"""The compiler of DeepSpeed's JIT op builds: a precompiled torch header for an op with many
torch sources, and objects shared between ops that compile the same source.

Each C++ source of an op that includes torch's extension header parses that header again,
which costs far more CPU than the source itself. GCC's precompiled header
(https://gcc.gnu.org/onlinedocs/gcc/Precompiled-Headers.html) parses it once and each source
then loads it, much faster than parsing it. With two compile jobs, ``n`` sources take
``n / 2 * parse`` of wall time without it and ``build + n / 2 * load`` with it, so it pays
off from :data:`MIN_TORCH_SOURCES` sources (the times per source: benchmarks/RESULTS.md, "A
probe launch: ranks forked after their imports, ops without debug information").
DeepSpeed's async I/O op (NVMe offload) has 9; its Adam and communication ops have two each
and are built as torch builds them.

torch runs ninja with the compiler ``CXX`` names. While an op loads, :func:`compiling`
names a wrapper script (``<folder>/<digest of the compiler>/g++``, which runs this file;
the same path for every Python and op folder, so that an op folder copied to another root
is up to date there) and tells it the op folder's root in the environment:

- For such an op, a torch source is compiled with ``-include`` of a header built, once per
  op and set of flags, with that source's own flags (GCC takes a ``.gch`` only for the
  flags it was built with). When the header does not build or the compile with it fails,
  the source is compiled as torch would have: the header changes how fast the op builds,
  not whether it builds. The ``.gch`` (hundreds of MB) is removed when the load returns.
- Every op: an object compiled from the same source with the same flags, but for the
  extension's name (``-DTORCH_EXTENSION_NAME``, which only a module's own source reads),
  is copied from the root's store instead of compiled again, while the source and every
  header its last compile read are as they were then (their sizes and modification times;
  torch's headers, outside the dependency file, are fixed by the root's torch version).
  DeepSpeed's Adam ops share ``cpu_adam_impl.cpp``, their longest compile unit.

Every load of an op names the same wrapper, so ninja sees the same command and does not
rebuild.

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
OBJECTS = "objects"  # the store of shared objects, under the op root's FOLDER
EXTENSION_NAME = "TORCH_EXTENSION_NAME"
REAL_CXX_VARIABLE = "AUTOTUNE_PCH_CXX"  # the compiler the wrapper runs
OP_FOLDER_VARIABLE = "AUTOTUNE_PCH_DIR"  # where the wrapper keeps headers and objects
HEADER_VARIABLE = "AUTOTUNE_PCH_HEADER"  # "1": compile torch sources with the header
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


def wrapper_path(folder: str, real_cxx: str) -> str:
    """The wrapper for compiler ``real_cxx`` under ``folder``; its name ends in ``g++``,
    which torch's compiler check accepts. The path names neither the Python that writes it
    nor the op folder: ninja rebuilds an op whose command changed, and every process that
    loads the op (another venv's, as in the GPU check, or one loading a copied op folder)
    must name the same command. The script runs the Python that wrote it last (this file
    needs only the standard library)."""
    resolved = os.path.realpath(shutil.which(real_cxx) or real_cxx)
    digest = hashlib.sha1(resolved.encode()).hexdigest()[:12]
    return os.path.join(folder, digest, "g++")


def write_wrapper(folder: str, real_cxx: str) -> str:
    """Write (or refresh) the wrapper script for ``real_cxx``; returns its path."""
    path = wrapper_path(folder, real_cxx)
    script = (
        "#!/bin/sh\n"
        "# autotune: DeepSpeed's op builds through autotune/op_pch.py\n"
        f"{REAL_CXX_VARIABLE}={shlex.quote(real_cxx)} "
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
def compiling(builder: Any, root: str, wrappers: str) -> Iterator[bool]:
    """While an op of op folder ``root`` loads: the wrapper (kept under ``wrappers``) as
    torch's compiler, with the precompiled header when the op has :data:`MIN_TORCH_SOURCES`
    torch sources or more (yields whether); the header is removed afterwards."""
    try:
        header = torch_source_count(builder) >= MIN_TORCH_SOURCES
    except Exception:  # noqa: BLE001 - an op builder of another DeepSpeed: no header
        header = False
    names = ("CXX", OP_FOLDER_VARIABLE, HEADER_VARIABLE)
    before = {name: os.environ.get(name) for name in names}
    current = before["CXX"] or "c++"
    if not current.startswith(os.path.join(wrappers, "")):  # not already ours (a nested load)
        current = write_wrapper(wrappers, current)
    os.environ["CXX"] = current
    os.environ[OP_FOLDER_VARIABLE] = os.path.join(root, FOLDER)
    os.environ[HEADER_VARIABLE] = "1" if header else "0"
    try:
        yield header
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if header:
            remove_headers(root, builder.name)


def _headers_dir(folder: str, op: str) -> str:
    """Where ``op``'s precompiled headers are built, under the wrapper's ``folder``."""
    return os.path.join(folder, "headers", op)


def remove_headers(root: str, op: str) -> None:
    """Remove the precompiled headers of ``op``'s build (hundreds of MB each)."""
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


_DEPENDENCY = re.compile(r"(?:\\.|[^\s\\])+")


def read_depfile(path: str) -> list[str]:
    """The prerequisites a ``-MMD`` dependency file lists (its target left out)."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read().replace("\\\n", " ")
    _, _, prerequisites = text.partition(": ")
    return [token.replace("\\ ", " ") for token in _DEPENDENCY.findall(prerequisites)]


def write_depfile(path: str, target: str, prerequisites: list[str]) -> None:
    escaped = [name.replace(" ", "\\ ") for name in [target, *prerequisites]]
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(f"{escaped[0]}: " + " \\\n  ".join(escaped[1:]) + "\n")


def _stamps(paths: list[str]) -> list[list[object]]:
    stamps: list[list[object]] = []
    for path in paths:
        status = os.stat(path)
        stamps.append([path, status.st_size, status.st_mtime_ns])
    return stamps


def _replace_with_copy(source: str, target: str) -> None:
    partial = f"{target}.{os.getpid()}.tmp"
    shutil.copyfile(source, partial)
    os.replace(partial, target)


class SharedObject:
    """The store's entry for one compile command: the object and what its compile read."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.object = os.path.join(directory, "object.o")
        self.record = os.path.join(directory, "dependencies.json")

    @classmethod
    def of(cls, real_cxx: str, folder: str, command: Compile) -> SharedObject | None:
        """The entry of ``command``, or None where its object is not shared: a command
        that compiles no C++ source to an object with a dependency file, or a source that
        reads the extension's name (its module definition)."""
        source = command.source
        if not (source and command.object and command.depfile) or not source.endswith(
            SOURCE_SUFFIXES
        ):
            return None
        try:
            with open(source, encoding="utf-8", errors="replace") as handle:
                if EXTENSION_NAME in handle.read():
                    return None
        except OSError:
            return None
        flags = [f for f in command.header_flags() if not f.startswith(f"-D{EXTENSION_NAME}=")]
        key_text = json.dumps([real_cxx, os.path.realpath(source), *flags])
        key = hashlib.sha1(key_text.encode()).hexdigest()[:16]
        return cls(os.path.join(folder, OBJECTS, key))

    def copy_to(self, command: Compile) -> bool:
        """Copy the stored object to the command's output, with its dependency file, if
        nothing its compile read has changed since; whether it did."""
        try:
            with open(self.record, encoding="utf-8") as handle:
                record = json.load(handle)
            if _stamps([path for path, _, _ in record["stamps"]]) != record["stamps"]:
                return False
            _replace_with_copy(self.object, str(command.object))
            write_depfile(str(command.depfile), str(command.object), record["dependencies"])
            return True
        except (OSError, ValueError, KeyError, TypeError):
            return False

    def keep(self, command: Compile) -> None:
        """Store the object the command has just compiled (best effort)."""
        with contextlib.suppress(OSError, ValueError):
            dependencies = read_depfile(str(command.depfile))
            record = {"dependencies": dependencies, "stamps": _stamps(dependencies)}
            os.makedirs(self.directory, exist_ok=True)
            _replace_with_copy(str(command.object), self.object)
            partial = f"{self.record}.{os.getpid()}.tmp"
            with open(partial, "w", encoding="utf-8") as handle:
                json.dump(record, handle)
            os.replace(partial, self.record)


def _compile(real_cxx: str, folder: str, command: Compile) -> int:
    """Compile as asked; a torch source with the header where the op wants it."""
    if os.environ.get(HEADER_VARIABLE) == "1" and command.is_torch_source():
        header = header_for(real_cxx, folder, command)
        if header is not None:
            done = subprocess.run(
                [real_cxx, *command.args, "-include", header, "-Winvalid-pch"],
                capture_output=True,
                text=True,
            )
            if done.returncode == 0:
                _drop_from_depfile(command.depfile, folder)
                sys.stdout.write(done.stdout)
                sys.stderr.write(done.stderr)
                return 0
    return subprocess.run([real_cxx, *command.args]).returncode


def main(argv: list[str]) -> int:
    """The wrapper: an object from the store, else a compile (with the header where the op
    wants it) whose object is stored; any other command runs the compiler as asked."""
    real_cxx = os.environ.get(REAL_CXX_VARIABLE) or "c++"
    folder = os.environ.get(OP_FOLDER_VARIABLE)
    if not folder:
        os.execvp(real_cxx, [real_cxx, *argv])
    command = Compile(argv)
    shared = SharedObject.of(real_cxx, folder, command)
    if shared is not None and shared.copy_to(command):
        return 0
    code = _compile(real_cxx, folder, command)
    if code == 0 and shared is not None:
        shared.keep(command)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
