"""Build hook for the optional C core (csrc/, via cffi); metadata is in pyproject.toml.

The core needs a C compiler and libhiredis. Without them emqfast still installs
and runs on its pure-Python backend. Set EMQFAST_REQUIRE_C=1 (CI does) to make
any C build problem fatal instead.
"""
import os
import shutil
import sys
import tempfile

from setuptools import setup
from setuptools.command.build_ext import build_ext

REQUIRE_C = os.environ.get("EMQFAST_REQUIRE_C") == "1"
FALLBACK = "installing without it: emqfast will use its pure-Python backend"


def say(message: str) -> None:
    print(f"emqfast: {message}", file=sys.stderr)


def missing_for_c() -> str:
    """What this machine lacks to build the C core ('' when nothing)."""
    try:
        import cffi  # noqa: F401
    except ImportError:
        return "the cffi package"
    from distutils.ccompiler import new_compiler
    from distutils.sysconfig import customize_compiler

    compiler = new_compiler()
    customize_compiler(compiler)  # honours CC, CFLAGS, LDFLAGS like the real build
    tmp = tempfile.mkdtemp(prefix="emqfast-probe-")
    probes = [
        ("a working C compiler", "int main(void) { return 0; }\n", False),
        ("the libhiredis headers (hiredis/hiredis.h: apt install libhiredis-dev, "
         "dnf install hiredis-devel, brew install hiredis)",
         "#include <hiredis/hiredis.h>\nint main(void) { return 0; }\n", False),
        ("the libhiredis library (-lhiredis)",
         "#include <hiredis/hiredis.h>\nint main(void) { redisFree(0); return 0; }\n", True),
    ]
    try:
        for what, code, link in probes:
            src = os.path.join(tmp, "probe.c")
            with open(src, "w") as fh:
                fh.write(code)
            try:
                objects = compiler.compile([src], output_dir=tmp)
                if link:
                    compiler.link_executable(objects, os.path.join(tmp, "probe"),
                                             libraries=["hiredis"])
            except Exception:  # CompileError, LinkError, no compiler at all...
                return what
        return ""
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class OptionalBuildExt(build_ext):
    """build_ext whose failure is a warning, not a failed install (unless EMQFAST_REQUIRE_C=1)."""

    def initialize_options(self) -> None:
        super().initialize_options()
        self.failed = set()  # file names of extensions that did not build

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # e.g. no compiler found when the command starts
            self._degrade(exc)

    def build_extension(self, ext) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._degrade(exc)
            self.failed.add(self.get_ext_filename(ext.name))

    # A failed extension has no file to install, package or copy in place.
    def copy_extensions_to_source(self) -> None:
        built = [ext for ext in self.extensions
                 if self.get_ext_filename(ext.name) not in self.failed]
        everything, self.extensions = self.extensions, built
        try:
            super().copy_extensions_to_source()
        finally:
            self.extensions = everything

    def get_outputs(self):
        return [out for out in super().get_outputs() if not self._is_failed(out)]

    def get_output_mapping(self):
        return {dst: src for dst, src in super().get_output_mapping().items()
                if not self._is_failed(src)}

    def _is_failed(self, path: str) -> bool:
        return any(path.endswith(name) for name in self.failed)

    def _degrade(self, exc: Exception) -> None:
        if REQUIRE_C:
            raise exc
        say(f"building the C core failed ({type(exc).__name__}: {exc}); {FALLBACK}")


options = {"cmdclass": {"build_ext": OptionalBuildExt}}
lacking = missing_for_c()
if not lacking:
    options["cffi_modules"] = ["csrc/build_ffi.py:ffibuilder"]
elif REQUIRE_C:
    sys.exit(f"emqfast: EMQFAST_REQUIRE_C=1 but the C core cannot be built: missing {lacking}")
else:
    say(f"C core not built: missing {lacking}; {FALLBACK}")

setup(**options)
