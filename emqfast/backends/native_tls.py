"""TLS for the C Batcher: a redis-py ``SSLConnection``'s settings mapped onto the C core's
``emq_conn_open_tls`` (hiredis' ssl.c over OpenSSL, compiled in: csrc/conn.c).

What the C side cannot honour exactly (an in-memory CA, an encrypted key, cipher or
protocol-version choices, OCSP, verify flags) raises :class:`BackendUnavailable`, so
that connection keeps using redis-py rather than getting weaker TLS than asked for.
"""
from __future__ import annotations

import os
import ssl
from typing import Any, Mapping, NamedTuple, Optional

from emqfast.backends._emqcore import ffi, lib
from emqfast.core.errors import BackendUnavailable

# redis-py settings the C path does not implement: any value but these defaults declines.
_UNSUPPORTED = {"ssl_ca_data": None, "ssl_password": None, "ssl_ciphers": None,
                "ssl_min_version": None, "ssl_include_verify_flags": None,
                "ssl_exclude_verify_flags": None, "ssl_validate_ocsp": False,
                "ssl_validate_ocsp_stapled": False, "ssl_ocsp_context": None,
                "ssl_ocsp_expected_cert": None}
_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL,
              "required": ssl.CERT_REQUIRED}


class TlsSettings(NamedTuple):
    """How the C Batcher sets up TLS (hashable: part of a shared connection's key)."""

    ca_file: Optional[str] = None
    ca_path: Optional[str] = None
    cert_file: Optional[str] = None
    key_file: Optional[str] = None
    verify: bool = True  # the server's certificate chain must verify
    check_hostname: bool = True  # ...and name the host (DNS name or IP) connected to


def built() -> bool:
    """Whether this build of the C core speaks TLS (it was compiled with OpenSSL)."""
    return bool(lib.emq_tls_built())


def _verify_mode(cert_reqs: Any) -> int:
    if cert_reqs is None:  # redis-py's reading of None
        return ssl.CERT_NONE
    if isinstance(cert_reqs, str):
        if cert_reqs.lower() not in _CERT_REQS:
            raise BackendUnavailable(f"unknown ssl_cert_reqs {cert_reqs!r}")
        return _CERT_REQS[cert_reqs.lower()]
    return int(cert_reqs)


def settings_from(kw: Mapping[str, Any]) -> TlsSettings:
    """The TLS settings of a redis-py ``SSLConnection``'s keyword arguments, or
    :class:`BackendUnavailable` when the C core cannot honour them all."""
    if not built():
        raise BackendUnavailable("this build of the C core has no TLS (no OpenSSL when "
                                 "it was compiled)")
    for name, default in _UNSUPPORTED.items():
        if kw.get(name, default) not in (default, None, [], ()):
            raise BackendUnavailable(f"the C batcher does not support TLS option {name}")
    # CERT_OPTIONAL means CERT_REQUIRED for a client (Python's ssl module says so).
    verify = _verify_mode(kw.get("ssl_cert_reqs", "required")) != ssl.CERT_NONE
    ca_file, ca_path = kw.get("ssl_ca_certs"), kw.get("ssl_ca_path")
    if verify and not (ca_file or ca_path):
        # The CA store Python's own OpenSSL uses (SSL_CERT_FILE honoured), not the one
        # compiled into a libssl a wheel may carry from another distribution.
        defaults = ssl.get_default_verify_paths()
        ca_file, ca_path = defaults.cafile, defaults.capath
    return TlsSettings(ca_file=ca_file, ca_path=ca_path, cert_file=kw.get("ssl_certfile"),
                       key_file=kw.get("ssl_keyfile"), verify=verify,
                       check_hostname=bool(kw.get("ssl_check_hostname", True)))


def _path(value: Optional[str]) -> Any:
    return ffi.NULL if not value else os.fsencode(value)


def open_tls(conn: Any, host: bytes, port: int, connect_timeout: float, io_timeout: float,
             tls: TlsSettings) -> int:
    """Connect ``conn`` (an ``emq_conn *``) over TLS; the C status code."""
    status: int = lib.emq_conn_open_tls(conn, host, port, connect_timeout, io_timeout,
                                        _path(tls.ca_file), _path(tls.ca_path),
                                        _path(tls.cert_file), _path(tls.key_file),
                                        int(tls.verify), int(tls.check_hostname))
    return status
