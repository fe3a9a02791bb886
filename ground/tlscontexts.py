"""TLS for placement's API: the server's context and the verifying client's.

Modern defaults as the edge's (edge/adapters/tls.py): TLS 1.2 and 1.3 only, no
compression, no renegotiation. A client always verifies the certificate and the
host name, against `cafile` (a PEM bundle: a private or local CA) or, without one,
the system's trust store; there is no switch to turn verification off.
"""

from __future__ import annotations

import ssl


def server_context(cert: str, key: str) -> ssl.SSLContext:
    """A server context with the chain in `cert` and its key (OSError/SSLError if either
    is missing, unreadable or does not match)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    context.set_alpn_protocols(["http/1.1"])
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"TLS certificate {cert} with key {key}: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None
    return context


def client_context(cafile: str = "") -> ssl.SSLContext:
    """A verifying client context: trusting `cafile`, else the system's CAs (ValueError
    naming the file, the CLI's and the edge's `--cacert`, if it is missing or no PEM)."""
    try:
        context = ssl.create_default_context(cafile=cafile or None)
    except ssl.SSLError as exc:  # (an OSError too: first)
        raise ValueError(f"--cacert {cafile}: not a PEM CA bundle ({exc.reason})") from None
    except OSError as exc:
        raise ValueError(f"--cacert {cafile}: {exc.strerror or exc}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def certificate_problem(exc: BaseException) -> str:
    """What a TLS failure says, in a line for an operator ("" if it is no TLS failure)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate not trusted: {exc.verify_message or exc.reason}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed: {exc.reason or exc}"
    return ""
