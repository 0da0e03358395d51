"""The release wheel carries its C core whole: ``scripts/build-wheel.sh`` (what
``make wheel`` runs) builds the sdist and, from it, a manylinux wheel; installed into a
fresh virtualenv, that wheel runs the C backend with no libhiredis from the system: hiredis
is compiled into the extension and OpenSSL is grafted into the wheel.

Slow-ish (about a minute: it builds and installs for real); ``-m "not wheel"`` skips it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.wheel, pytest.mark.timeout(400)]

# Runs inside the fresh venv: which backend, where everything was loaded from, and a
# real enqueue_many through the C batcher.
PROBE = r"""
import json, os, sys
import emqfast
from emqfast.backends import _emqcore, select
conn = emqfast.connect(sys.argv[1])
q = emqfast.Queue(sys.argv[2], conn)
refs = q.enqueue_many([{"n": i} for i in range(500)])
conn.delete(*conn.keys("emq:{%s}:*" % sys.argv[2]))
maps = open("/proc/self/maps").read().split("\n")
print(json.dumps({
    "backend": emqfast.backend(),
    "package": emqfast.__file__,
    "extension": _emqcore.__file__,
    "c_batcher": isinstance(select.batcher_for(conn), select.SharedBatcher),
    "enqueued": len(refs),
    "tls": bool(_emqcore.lib.emq_tls_built()),
    "mapped": sorted({line.split()[-1] for line in maps if ".so" in line}),
}))
"""


def _run(*args: str, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, **kw)
    assert done.returncode == 0, f"{args[:3]} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory):
    """(venv python, wheel path): the wheel built by the script, installed in a new venv."""
    tmp = tmp_path_factory.mktemp("wheel")
    env = dict(os.environ, OUT=str(tmp / "dist"), PYTHON=sys.executable)
    _run(str(ROOT / "scripts" / "build-wheel.sh"), env=env, cwd=ROOT)
    wheels = sorted((tmp / "dist").glob("emqfast-*-manylinux*.whl"))
    assert len(wheels) == 1 and list((tmp / "dist").glob("emqfast-*.tar.gz")), \
        list((tmp / "dist").iterdir())
    venv = tmp / "venv"
    _run(sys.executable, "-m", "venv", str(venv))
    python = venv / "bin" / "python"
    _run(str(python), "-m", "pip", "install", "-q", str(wheels[0]))
    return python, wheels[0]


def test_the_wheel_is_manylinux_abi3_and_carries_openssl(wheel_venv):
    _, wheel = wheel_venv
    assert "-cp39-abi3-manylinux" in wheel.name  # one wheel for every CPython >= 3.9
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert [n for n in names if n.startswith("emqfast/backends/_emqcore")]
    assert [n for n in names if n.startswith("emqfast.libs/libssl")]
    assert not [n for n in names if "hiredis" in n.lower()]  # compiled in, not a library


def test_installed_wheel_runs_c_with_no_system_hiredis(wheel_venv, redis_url, tmp_path, qname):
    python, _ = wheel_venv
    # Shadow every libhiredis name with a broken file ahead of the system's: anything
    # that asked the loader for libhiredis would fail to import.
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    for name in ("libhiredis.so", "libhiredis.so.0.14", "libhiredis.so.1.1.0",
                 "libhiredis_ssl.so", "libhiredis_ssl.so.1.1.0"):
        (shadow / name).write_bytes(b"not a library")
    env = dict(os.environ, EMQFAST_BACKEND="c", LD_LIBRARY_PATH=str(shadow),
               PYTHONPATH="")
    done = _run(str(python), "-c", PROBE, redis_url, qname, env=env, cwd=tmp_path)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    venv = str(python.parent.parent)
    assert got["backend"] == "c" and got["c_batcher"] and got["tls"]
    assert got["package"].startswith(venv)  # the installed wheel, not the source tree
    assert got["enqueued"] == 500
    # no libhiredis mapped at all (hiredis-py's own extension, a dependency, may be)
    assert not [m for m in got["mapped"] if os.path.basename(m).startswith("libhiredis")]
    ssl_libs = [m for m in got["mapped"] if "/libssl" in m and "_emqcore" not in m]
    assert any(m.startswith(venv) and "emqfast.libs" in m for m in ssl_libs), ssl_libs

    ldd = _run("ldd", got["extension"]).stdout
    assert "hiredis" not in ldd and "not found" not in ldd, ldd
    wheel_ssl = [line for line in ldd.splitlines() if "libssl" in line]
    assert wheel_ssl and all("emqfast.libs" in line for line in wheel_ssl), ldd
