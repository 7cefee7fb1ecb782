"""The compiler of op builds (autotune/op_pch.py), with the real GCC: the precompiled torch
header, and objects shared between ops.

torch's own header takes ~47 s to precompile, so these tests stand a small header of their
own at ``torch/extension.h`` in a folder passed with ``-I``; DeepSpeed's async I/O op is
built through the wrapper with torch's real header wherever the NVMe tests build it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.backends.deepspeed import _op_pch as op_pch

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")

HEADER = """#pragma once
inline int torch_answer() { return 42; }
"""


def tree(tmp_path: Path, source: str) -> tuple[Path, Path]:
    include = tmp_path / "include"
    (include / "torch").mkdir(parents=True)
    (include / "torch" / "extension.h").write_text(HEADER)
    (tmp_path / "local.h").write_text("#include <torch/extension.h>\n")
    path = tmp_path / "op.cpp"
    path.write_text(source)
    return include, path


def command(compiler: str, include: Path, source: Path, obj: Path, op: str = "demo") -> list[str]:
    """One compile command as torch's ninja file writes it."""
    return [
        compiler, "-MMD", "-MF", f"{obj}.d", f"-DTORCH_EXTENSION_NAME={op}", f"-I{include}",
        "-fPIC", "-std=c++17", "-c", str(source), "-o", str(obj),
    ]  # fmt: skip


def compile_through(
    wrapper: str,
    root: Path,
    include: Path,
    source: Path,
    obj: Path,
    *,
    header: bool = True,
    op: str = "demo",
) -> str:
    """Compile through the wrapper as a load of an op of op folder ``root`` does."""
    env = {
        **os.environ,
        op_pch.OP_FOLDER_VARIABLE: str(root / op_pch.FOLDER),
        op_pch.HEADER_VARIABLE: "1" if header else "0",
    }
    done = subprocess.run(
        command(wrapper, include, source, obj, op), capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def stored(root: Path) -> list[Path]:
    return sorted((root / op_pch.FOLDER / op_pch.OBJECTS).glob("*/object.o"))


def symbols(obj: Path) -> list[str]:
    out = subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True).stdout
    return sorted(line.split()[-1] for line in out.splitlines())


def headers(root: Path) -> list[Path]:
    return sorted((root / op_pch.FOLDER).rglob("*.gch"))


def test_a_source_includes_torch_through_its_quoted_headers(tmp_path: Path) -> None:
    include, _ = tree(tmp_path, "")
    (tmp_path / "direct.cpp").write_text("#include <torch/extension.h>\n")
    (tmp_path / "through.cpp").write_text('#include "local.h"\n')
    (tmp_path / "a.h").write_text('#include "b.h"\n')
    (tmp_path / "b.h").write_text('#include "a.h"\n#include <vector>\n')  # a cycle, no torch
    (tmp_path / "plain.cpp").write_text('#include <vector>\n#include "a.h"\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "elsewhere.cpp").write_text('#include "local.h"\n')  # found via -I
    dirs = [str(include)]
    assert op_pch.includes_torch(str(tmp_path / "direct.cpp"), dirs)
    assert op_pch.includes_torch(str(tmp_path / "through.cpp"), dirs)
    assert not op_pch.includes_torch(str(tmp_path / "plain.cpp"), dirs)
    assert not op_pch.includes_torch(str(tmp_path / "sub" / "elsewhere.cpp"), dirs)
    assert op_pch.includes_torch(str(tmp_path / "sub" / "elsewhere.cpp"), [str(tmp_path)])


def test_a_torch_source_compiles_with_the_header_to_the_same_object(tmp_path: Path) -> None:
    include, source = tree(
        tmp_path, '#include "local.h"\nint answer() { return torch_answer(); }\n'
    )
    root = tmp_path / "ops"
    wrapper = op_pch.write_wrapper(str(tmp_path / "wrappers"), "c++")
    assert wrapper.endswith("g++") and os.access(wrapper, os.X_OK)  # torch's compiler check
    assert op_pch.write_wrapper(str(tmp_path / "wrappers"), "c++") == wrapper  # one per compiler

    compile_through(wrapper, root, include, source, tmp_path / "with.o")
    built = headers(root)
    assert len(built) == 1 and "demo" in built[0].parts  # one header, under its op
    depfile = (tmp_path / "with.o.d").read_text()
    assert "local.h" in depfile and op_pch.FOLDER not in depfile  # the header is removed later

    subprocess.run(command("c++", include, source, tmp_path / "plain.o"), check=True)
    assert symbols(tmp_path / "with.o") == symbols(tmp_path / "plain.o")

    compile_through(wrapper, root, include, source, tmp_path / "again.o", op="other")
    assert headers(root) == built  # built once, used again

    op_pch.remove_headers(str(root), "demo")
    assert headers(root) == [] and os.access(wrapper, os.X_OK)


def test_a_source_the_header_breaks_compiles_as_torch_would(tmp_path: Path) -> None:
    # The source sets a macro the header reads before including it: with the header forced
    # in first, the header has read its own default and the source's check fails.
    include, source = tree(
        tmp_path,
        "#define TORCH_FLAVOUR 2\n#include <torch/extension.h>\n"
        "static_assert(flavour() == 2);\nint answer() { return flavour(); }\n",
    )
    (include / "torch" / "extension.h").write_text(
        "#pragma once\n#ifndef TORCH_FLAVOUR\n#define TORCH_FLAVOUR 1\n#endif\n"
        "constexpr int flavour() { return TORCH_FLAVOUR; }\n"
    )
    root = tmp_path / "ops"
    wrapper = op_pch.write_wrapper(str(tmp_path / "wrappers"), "c++")
    compile_through(wrapper, root, include, source, tmp_path / "op.o")
    assert len(headers(root)) == 1  # the header built; the source compiled without it
    assert "_Z6answerv" in symbols(tmp_path / "op.o")


def test_a_header_that_does_not_build_is_not_tried_again(tmp_path: Path) -> None:
    include, source = tree(
        tmp_path, '#include "local.h"\nint answer() { return torch_answer(); }\n'
    )
    (include / "torch" / "extension.h").write_text(
        "#ifndef FROM_SOURCE\n#error the header alone does not build\n#endif\n" + HEADER
    )
    source.write_text("#define FROM_SOURCE\n" + source.read_text())
    root = tmp_path / "ops"
    wrapper = op_pch.write_wrapper(str(tmp_path / "wrappers"), "c++")
    compile_through(wrapper, root, include, source, tmp_path / "one.o")
    source.write_text(source.read_text() + "int more() { return 1; }\n")  # compiled again
    compile_through(wrapper, root, include, source, tmp_path / "two.o")
    failed = list((root / op_pch.FOLDER).rglob(op_pch.FAILED))
    assert len(failed) == 1 and "does not build" in failed[0].read_text()
    assert headers(root) == []


def test_only_an_op_with_many_torch_sources_gets_the_header() -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.ops.op_builder.cpu import AsyncIOBuilder, CPUAdamBuilder

    assert op_pch.torch_source_count(AsyncIOBuilder()) >= op_pch.MIN_TORCH_SOURCES
    assert op_pch.torch_source_count(CPUAdamBuilder()) < op_pch.MIN_TORCH_SOURCES


def test_the_compiler_is_named_only_while_the_op_loads(tmp_path: Path, monkeypatch) -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.ops.op_builder.cpu import AsyncIOBuilder, CPUAdamBuilder

    monkeypatch.delenv("CXX", raising=False)
    wrappers = str(tmp_path / "wrappers")
    folder = str(tmp_path / op_pch.FOLDER)
    with op_pch.compiling(CPUAdamBuilder(), str(tmp_path), wrappers) as header:
        assert not header and os.environ[op_pch.HEADER_VARIABLE] == "0"
        assert os.environ["CXX"] == op_pch.wrapper_path(wrappers, "c++")
        assert os.environ[op_pch.OP_FOLDER_VARIABLE] == folder
    with op_pch.compiling(AsyncIOBuilder(), str(tmp_path), wrappers) as header:
        assert header and os.environ[op_pch.HEADER_VARIABLE] == "1"
        assert os.environ["CXX"] == op_pch.wrapper_path(wrappers, "c++")
    for name in ("CXX", op_pch.OP_FOLDER_VARIABLE, op_pch.HEADER_VARIABLE):
        assert name not in os.environ


def test_an_object_is_shared_between_ops_while_what_it_read_is_unchanged(tmp_path: Path) -> None:
    include, source = tree(
        tmp_path, '#include "local.h"\nint answer() { return torch_answer(); }\n'
    )
    root = tmp_path / "ops"
    wrapper = op_pch.write_wrapper(str(tmp_path / "wrappers"), "c++")
    compile_through(wrapper, root, include, source, tmp_path / "a.o", header=False, op="a")
    assert len(stored(root)) == 1
    stamp = (tmp_path / "a.o").stat().st_mtime_ns
    compile_through(wrapper, root, include, source, tmp_path / "b.o", header=False, op="b")
    assert (tmp_path / "b.o").read_bytes() == (tmp_path / "a.o").read_bytes()
    assert (tmp_path / "a.o").stat().st_mtime_ns == stamp and len(stored(root)) == 1
    target, _ = (tmp_path / "b.o.d").read_text().split(":", 1)
    assert target == str(tmp_path / "b.o")  # ninja reads the copy's dependencies
    read = [str(source), str(tmp_path / "local.h"), str(include / "torch" / "extension.h")]
    assert op_pch.read_depfile(str(tmp_path / "b.o.d")) == read

    # a header it read changes: compiled again, and the new object kept
    (tmp_path / "local.h").write_text("#include <torch/extension.h>\nint extra() { return 1; }\n")
    compile_through(wrapper, root, include, source, tmp_path / "c.o", header=False, op="c")
    assert "_Z5extrav" in symbols(tmp_path / "c.o") and "_Z5extrav" not in symbols(tmp_path / "b.o")
    compile_through(wrapper, root, include, source, tmp_path / "d.o", header=False, op="d")
    assert (tmp_path / "d.o").read_bytes() == (tmp_path / "c.o").read_bytes()


def test_a_source_that_reads_the_extension_name_is_compiled_for_each_op(tmp_path: Path) -> None:
    include, source = tree(
        tmp_path,
        "#define STR(x) #x\n#define NAME(x) STR(x)\n"
        "const char* name() { return NAME(TORCH_EXTENSION_NAME); }\n",
    )
    root = tmp_path / "ops"
    wrapper = op_pch.write_wrapper(str(tmp_path / "wrappers"), "c++")
    compile_through(wrapper, root, include, source, tmp_path / "a.o", header=False, op="alpha")
    compile_through(wrapper, root, include, source, tmp_path / "b.o", header=False, op="beta")
    assert stored(root) == []
    assert (
        b"alpha" in (tmp_path / "a.o").read_bytes() and b"beta" in (tmp_path / "b.o").read_bytes()
    )


def test_a_dependency_file_with_spaces_reads_back(tmp_path: Path) -> None:
    depfile = tmp_path / "x.o.d"
    op_pch.write_depfile(str(depfile), "x.o", ["/a b/c.cpp", "/d/e.h"])
    assert op_pch.read_depfile(str(depfile)) == ["/a b/c.cpp", "/d/e.h"]


def test_every_python_names_the_same_wrapper(tmp_path: Path) -> None:
    """ninja rebuilds an op whose command changed: a process of another venv (the GPU
    check's) must name the same compiler script as this one, whichever wrote it last."""
    other = getattr(sys, "_base_executable", sys.executable)
    code = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('op_pch', sys.argv[1])\n"
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        "print(module.write_wrapper(sys.argv[2], 'c++'))\n"
    )
    done = subprocess.run(
        [other, "-c", code, op_pch.__file__, str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    path = done.stdout.strip()
    assert path == op_pch.write_wrapper(str(tmp_path), "c++")
    assert sys.executable in Path(path).read_text()  # the last writer's Python runs it
