"""The precompiled torch header of an op build (autotune/op_pch.py), with the real GCC.

torch's own header takes ~47 s to precompile, so these tests stand a small header of their
own at ``torch/extension.h`` in a folder passed with ``-I``; DeepSpeed's async I/O op is
built through the wrapper with torch's real header wherever the NVMe tests build it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from autotune import op_pch

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


def command(compiler: str, include: Path, source: Path, obj: Path) -> list[str]:
    """One compile command as torch's ninja file writes it."""
    return [
        compiler, "-MMD", "-MF", f"{obj}.d", "-DTORCH_EXTENSION_NAME=demo", f"-I{include}",
        "-fPIC", "-std=c++17", "-c", str(source), "-o", str(obj),
    ]  # fmt: skip


def compile_through(wrapper: str, include: Path, source: Path, obj: Path) -> str:
    done = subprocess.run(command(wrapper, include, source, obj), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stderr


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
    wrapper = op_pch.write_wrapper(str(root), "c++")
    assert wrapper.endswith("g++") and os.access(wrapper, os.X_OK)  # torch's compiler check
    assert op_pch.write_wrapper(str(root), "c++") == wrapper  # one path per compiler

    compile_through(wrapper, include, source, tmp_path / "with.o")
    built = headers(root)
    assert len(built) == 1 and "demo" in built[0].parts  # one header, under its op
    depfile = (tmp_path / "with.o.d").read_text()
    assert "local.h" in depfile and op_pch.FOLDER not in depfile  # the header is removed later

    subprocess.run(command("c++", include, source, tmp_path / "plain.o"), check=True)
    assert symbols(tmp_path / "with.o") == symbols(tmp_path / "plain.o")

    compile_through(wrapper, include, source, tmp_path / "again.o")
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
    wrapper = op_pch.write_wrapper(str(root), "c++")
    compile_through(wrapper, include, source, tmp_path / "op.o")
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
    wrapper = op_pch.write_wrapper(str(root), "c++")
    compile_through(wrapper, include, source, tmp_path / "one.o")
    compile_through(wrapper, include, source, tmp_path / "two.o")
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
    with op_pch.compiling(CPUAdamBuilder(), str(tmp_path)) as used:
        assert not used and "CXX" not in os.environ
    with op_pch.compiling(AsyncIOBuilder(), str(tmp_path)) as used:
        assert used and os.environ["CXX"] == op_pch.wrapper_path(str(tmp_path), "c++")
    assert "CXX" not in os.environ
