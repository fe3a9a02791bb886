"""A small synchronous client of placement's public API, for the CLI.

Over https the server's certificate is always verified (ground/tlscontexts.py): against
`cafile`, else the system's CAs. Failures are ApiError with status 0 and a line that
says what went wrong (an untrusted certificate, TLS spoken to plain HTTP or the other
way round), never a traceback.
"""

from __future__ import annotations

import http.client
import json
import ssl
from typing import Any
from urllib.parse import urlsplit

from ground.tlscontexts import certificate_problem, client_context


class ApiError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        if isinstance(body, dict):
            message = body.get("message") or body.get("error") or str(body)
            if body.get("field"):
                message = f"{body['field']}: {message}"
        else:
            message = str(body)
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status
        self.body = body


class ApiClient:
    def __init__(self, base_url: str, token: str = "", timeout_s: float = 60.0,
                 cafile: str = "") -> None:
        """`cafile`: the PEM CA bundle an https API's certificate is checked against ("":
        the system's)."""
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"API URL must be http(s)://host:port, not {base_url!r}")
        self.host = parts.hostname
        self.tls: ssl.SSLContext | None = None
        if parts.scheme == "https":
            self.tls = client_context(cafile)
        self.port = parts.port or (443 if self.tls else 80)
        self.token = token
        self.timeout_s = timeout_s

    def _connection(self) -> http.client.HTTPConnection:
        if self.tls is not None:
            return http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout_s,
                                               context=self.tls)
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)

    def _unreachable(self, exc: Exception) -> ApiError:
        where = f"{self.host}:{self.port}"
        problem = certificate_problem(exc)
        if isinstance(exc, ssl.SSLCertVerificationError):
            return ApiError(0, f"{where}: {problem} (pass --cacert PATH or set THAW_CACERT "
                               "to the CA that signed the API's certificate)")
        if problem:
            return ApiError(0, f"{where}: {problem} (does the API speak "
                               f"{'https' if self.tls is None else 'plain http'}?)")
        hint = "" if self.tls is not None else " (if the API is served over TLS: --api https://…)"
        return ApiError(0, f"cannot reach {where}: {exc}{hint if _cut_off(exc) else ''}")

    def request(self, method: str, path: str, body: Any = None) -> Any:
        conn = self._connection()
        headers = {"Accept": "application/json"}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise self._unreachable(exc) from None
        finally:
            conn.close()
        decoded: Any = data.decode(errors="replace")
        if "json" in (response.getheader("Content-Type") or ""):
            decoded = json.loads(data) if data else None
        if response.status >= 400:
            raise ApiError(response.status, decoded)
        return decoded

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body if body is not None else {})

    def patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)


def _cut_off(exc: Exception) -> bool:
    """A plain HTTP request to a TLS port: the server hangs up or answers garbage."""
    return isinstance(exc, (http.client.RemoteDisconnected, http.client.BadStatusLine,
                            ConnectionResetError))
