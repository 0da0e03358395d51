"""Build hook for the optional C core (csrc/, via cffi); metadata is in pyproject.toml.

The core needs a C compiler (hiredis is compiled in from csrc/vendor/hiredis) and,
for TLS (rediss://) on the C path, OpenSSL's headers (libssl-dev / openssl-devel);
without OpenSSL it is built without TLS, and TLS connections use redis-py. Without
a compiler emqfast still installs and runs on its pure-Python backend. The build
says which it made. Set EMQFAST_REQUIRE_C=1 (CI does) to make any C build problem,
a missing OpenSSL included, fatal instead; EMQFAST_TLS=0 builds without TLS.
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


TLS_PROBE = ("OpenSSL's headers and libraries (apt install libssl-dev, "
             "dnf install openssl-devel, brew install openssl)",
             "#include <openssl/ssl.h>\nint main(void) { SSL_CTX_free(0); return 0; }\n",
             ["ssl", "crypto"])


def _probe(compiler, tmp: str, code: str, libraries) -> bool:
    """Whether ``code`` compiles (and links against ``libraries`` unless None)."""
    src = os.path.join(tmp, "probe.c")
    with open(src, "w") as fh:
        fh.write(code)
    try:
        objects = compiler.compile([src], output_dir=tmp)
        if libraries is not None:
            compiler.link_executable(objects, os.path.join(tmp, "probe"), libraries=libraries)
    except Exception:  # CompileError, LinkError, no compiler at all...
        return False
    return True


def missing_for_c() -> "tuple[str, str]":
    """What this machine lacks to build the C core, then to build it with TLS
    ('' when nothing)."""
    try:
        import cffi  # noqa: F401
    except ImportError:
        return "the cffi package", ""
    from distutils.ccompiler import new_compiler
    from distutils.sysconfig import customize_compiler

    compiler = new_compiler()
    customize_compiler(compiler)  # honours CC, CFLAGS, LDFLAGS like the real build
    tmp = tempfile.mkdtemp(prefix="emqfast-probe-")
    try:
        if not _probe(compiler, tmp, "int main(void) { return 0; }\n", None):
            return "a working C compiler", ""
        what, code, libraries = TLS_PROBE
        return "", ("" if _probe(compiler, tmp, code, libraries) else what)
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


def configure() -> dict:
    """setup() options: the C core when it can be built (with TLS when OpenSSL is
    there), saying which on stderr; none (the pure-Python backend) otherwise."""
    options = {"cmdclass": {"build_ext": OptionalBuildExt}}
    lacking, lacking_tls = missing_for_c()
    no_tls = ""
    if os.environ.get("EMQFAST_TLS") == "0":
        no_tls, lacking_tls = "EMQFAST_TLS=0", ""
    if lacking:
        if REQUIRE_C:
            sys.exit(f"emqfast: EMQFAST_REQUIRE_C=1 but the C core cannot be built: "
                     f"missing {lacking}")
        say(f"C core not built: missing {lacking}; {FALLBACK}")
        return options
    if lacking_tls and REQUIRE_C:
        sys.exit(f"emqfast: EMQFAST_REQUIRE_C=1 but the C core cannot speak TLS: "
                 f"missing {lacking_tls}")
    no_tls = no_tls or (f"missing {lacking_tls}" if lacking_tls else "")
    os.environ["EMQFAST_TLS"] = "0" if no_tls else "1"  # read by csrc/build_ffi.py
    say("building the C core (hiredis compiled in) "
        + (f"WITHOUT TLS ({no_tls}): rediss:// will use redis-py" if no_tls
           else "with TLS (OpenSSL)"))
    options["cffi_modules"] = ["csrc/build_ffi.py:ffibuilder"]
    # cffi builds the extension on the stable ABI: one cp39-abi3 wheel for every CPython
    options["options"] = {"bdist_wheel": {"py_limited_api": "cp39"}}
    return options


setup(**configure())
