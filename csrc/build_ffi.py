"""cffi builder for ``emqfast.backends._emqcore`` (API / out-of-line mode).

setup.py points ``cffi_modules`` here. For in-tree iteration without pip::

    python csrc/build_ffi.py        # builds under build/cffi, copies the .so into emqfast/

The cdef is the region of emq.h between ``/* CDEF-BEGIN */`` and
``/* CDEF-END */``, so every declaration is written exactly once.
"""
from __future__ import annotations

import os
import re
import sys

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = ["scores.c", "backoff.c", "conn.c", "resp.c", "pipeline.c", "bulk.c"]


def _rel(path: str) -> str:
    """Paths relative to the cwd when possible: setuptools prefers them."""
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return path
    return path if rel.startswith("..") else rel


def read_cdef(header: str = os.path.join(HERE, "emq.h")) -> str:
    """The declarations between the CDEF markers of ``header``."""
    with open(header, encoding="utf-8") as fh:
        text = fh.read()
    match = re.search(r"/\* CDEF-BEGIN \*/(.*?)/\* CDEF-END \*/", text, re.S)
    if match is None:
        raise RuntimeError(f"{header}: CDEF-BEGIN/CDEF-END markers not found")
    return match.group(1)


def make_builder(relative: bool = True) -> FFI:
    """The builder; ``relative`` paths suit setup.py (run from the project root),
    absolute ones suit ``FFI.compile``, which chdirs into its tmpdir."""
    fix = _rel if relative else (lambda path: path)
    builder = FFI()
    builder.cdef(read_cdef())
    builder.set_source(
        "emqfast.backends._emqcore",
        '#include "emq.h"',
        sources=[fix(os.path.join(HERE, name)) for name in SOURCES],
        include_dirs=[fix(HERE)],
        libraries=["hiredis"],
        extra_compile_args=["-O2", "-Wall", "-Wextra"],
    )
    return builder


ffibuilder = make_builder()


def build_inplace() -> str:
    """Compile into build/cffi and copy the extension next to the package."""
    import glob
    import shutil

    root = os.path.dirname(HERE)
    built = make_builder(relative=False).compile(
        tmpdir=os.path.join(root, "build", "cffi"), verbose=True)
    # A stale build under another suffix (e.g. pip's .abi3.so) could shadow this one.
    for old in glob.glob(os.path.join(root, "emqfast", "backends", "_emqcore*.so")):
        os.remove(old)
    target = os.path.join(root, "emqfast", "backends", os.path.basename(built))
    shutil.copyfile(built, target)
    return target


if __name__ == "__main__":
    print(build_inplace(), file=sys.stderr)
