"""cffi builder for ``emqfast.backends._emqcore`` (API / out-of-line mode).

setup.py points ``cffi_modules`` here. For in-tree iteration without pip::

    python csrc/build_ffi.py        # builds under build/cffi, copies the .so into emqfast/

The cdef is the region of emq.h between ``/* CDEF-BEGIN */`` and
``/* CDEF-END */``, so every declaration is written exactly once.

hiredis is not a system dependency: its pinned C sources (csrc/vendor/hiredis, see
VENDORED.md there) are compiled into the extension, so a wheel carries it inside. TLS
(hiredis' ssl.c) is compiled in and linked to OpenSSL unless ``EMQFAST_TLS=0`` (setup.py
sets it after probing for the OpenSSL headers).
"""
from __future__ import annotations

import os
import re
import sys

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = ["scores.c", "backoff.c", "conn.c", "resp.c", "pipeline.c", "bulk.c"]
VENDOR = os.path.join(HERE, "vendor")  # on the include path: <hiredis/hiredis.h> is ours
HIREDIS_VERSION = "1.3.0"
# dict.c is #included by async.c; ssl.c only with TLS.
HIREDIS_SOURCES = ["alloc.c", "async.c", "hiredis.c", "net.c", "read.c", "sds.c", "sockcompat.c"]


def tls_enabled() -> bool:
    """Whether this build compiles hiredis' TLS support in (needs OpenSSL's headers)."""
    return os.environ.get("EMQFAST_TLS", "1") != "0"


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
    tls = tls_enabled()
    hiredis = HIREDIS_SOURCES + (["ssl.c"] if tls else [])
    builder = FFI()
    builder.cdef(read_cdef())
    builder.set_source(
        "emqfast.backends._emqcore",
        '#include "emq.h"',
        sources=[fix(os.path.join(HERE, name)) for name in SOURCES]
        + [fix(os.path.join(VENDOR, "hiredis", name)) for name in hiredis],
        include_dirs=[fix(HERE), fix(VENDOR)],
        define_macros=[("EMQ_TLS", "1")] if tls else [],
        libraries=["ssl", "crypto"] if tls else [],
        # hidden: hiredis' symbols stay private to the extension (never bound to, or
        # from, another hiredis in the process); cffi exports PyInit explicitly.
        extra_compile_args=["-O2", "-Wall", "-Wextra", "-fvisibility=hidden"],
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
