"""Image references: parse `HOST[:PORT]/REPO[:TAG][@sha256:HEX]` and `oci:PATH[:TAG]`.

Pure: decides nothing about the network beyond the URL scheme (plain http for
loopback hosts only). A reference without a registry host is a Docker Hub name.
Invariant: a parsed reference re-renders to an equivalent string with `str()`.
Shared ground: app configs are checked with it (ground/appconfig.py) and the image cache
pulls by it (imagecache/core/reference.py gives its refusal the cache's error code).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

DOCKER_HUB = "registry-1.docker.io"
DEFAULT_TAG = "latest"

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_REPO_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
# IPv6 in brackets may end in dotted IPv4 (`[::ffff:10.0.0.1]`); the egress policy judges it.
_HOST = re.compile(r"^(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?$")


class BadReference(ValueError):
    """Not an image reference: `message` names what is wrong."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class RegistryRef:
    """An image in a Distribution v2 registry. `host` includes the port, if any."""

    host: str
    repository: str
    tag: str
    digest: str | None = None

    @property
    def base_url(self) -> str:
        scheme = "http" if is_loopback_host(self.host) else "https"
        return f"{scheme}://{self.host}"

    @property
    def reference(self) -> str:
        """What goes after `/manifests/`: the digest when pinned, else the tag."""
        return self.digest or self.tag

    def __str__(self) -> str:
        pin = f"@{self.digest}" if self.digest else ""
        return f"{self.host}/{self.repository}:{self.tag}{pin}"


@dataclass(frozen=True)
class LayoutRef:
    """An image in an OCI image-layout directory, selected by its ref.name annotation:
    `tag` is "v1" or "NAME:v1" (see `manifest.select_tag`)."""

    path: str
    tag: str

    def __str__(self) -> str:
        return f"oci:{self.path}:{self.tag}"


ImageRef = RegistryRef | LayoutRef


def is_digest(text: str) -> bool:
    return bool(_DIGEST.match(text))


def is_loopback_host(host: str) -> bool:
    """True for localhost, 127.0.0.0/8 and ::1, with or without a port."""
    name = _strip_port(host)
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def _strip_port(host: str) -> str:
    if host.startswith("["):
        return host[: host.index("]") + 1]
    return host.rsplit(":", 1)[0] if ":" in host else host


def parse_reference(text: str) -> ImageRef:
    """Parse an image reference; raise BadReference naming what is wrong."""
    if not text or text != text.strip():
        raise BadReference(f"empty or padded reference {text!r}")
    if text.startswith("oci:"):
        return _parse_layout(text)
    return _parse_registry(text)


def _parse_layout(text: str) -> LayoutRef:
    body = text[len("oci:") :]
    path, tag = body, DEFAULT_TAG
    head, sep, tail = body.rpartition(":")
    if sep and "/" not in tail and tail:
        path, tag = head, tail
        # `oci:PATH:NAME:TAG`: an image `thaw image build -t NAME:TAG` wrote into a layout
        # (its ref.name is "NAME:TAG"). A layout dir whose own name has a colon is read as
        # PATH:NAME; the resolver falls back to it when PATH is no directory.
        rest, colon, name = path.rpartition(":")
        if colon and rest and all(_REPO_COMPONENT.match(p) for p in name.split("/")):
            path, tag = rest, f"{name}:{tag}"
    if not path:
        raise BadReference(f"{text!r}: no layout path")
    return LayoutRef(path=path, tag=tag)


def _parse_registry(text: str) -> RegistryRef:
    name, digest = text, None
    if "@" in text:
        name, digest = text.split("@", 1)
        if not is_digest(digest):
            raise BadReference(f"{text!r}: digest must be sha256:<64 hex>")
    host, remainder = _split_host(name)
    repository, tag = remainder, DEFAULT_TAG
    last = remainder.rsplit("/", 1)[-1]
    if ":" in last:
        repository, tag = remainder.rsplit(":", 1)
    _check_repository(text, repository)
    if not _TAG.match(tag):
        raise BadReference(f"{text!r}: bad tag {tag!r}")
    if host == DOCKER_HUB and "/" not in repository:
        repository = f"library/{repository}"
    return RegistryRef(host=host, repository=repository, tag=tag, digest=digest)


def _split_host(name: str) -> tuple[str, str]:
    first, sep, rest = name.partition("/")
    looks_like_host = "." in first or ":" in first or first == "localhost" or first.startswith("[")
    if not sep or not looks_like_host:
        return DOCKER_HUB, name
    if not _HOST.match(first):
        raise BadReference(f"{name!r}: bad registry host {first!r}")
    return first, rest


def _check_repository(text: str, repository: str) -> None:
    parts = repository.split("/")
    if not repository or not all(_REPO_COMPONENT.match(p) for p in parts):
        raise BadReference(f"{text!r}: bad repository {repository!r}")
