"""A small synchronous client of placement's public API, for the CLI."""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import urlsplit


class ApiError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        if isinstance(body, dict):
            message = body.get("message") or body.get("error") or str(body)
            if body.get("field"):
                message = f"{body['field']}: {message}"
        else:
            message = str(body)
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.body = body


class ApiClient:
    def __init__(self, base_url: str, token: str = "", timeout_s: float = 60.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"API URL must be http://host:port, not {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.token = token
        self.timeout_s = timeout_s

    def request(self, method: str, path: str, body: Any = None) -> Any:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
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
        except OSError as exc:
            raise ApiError(0, f"cannot reach {self.host}:{self.port}: {exc}") from None
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
