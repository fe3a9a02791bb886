"""Wire types of the image cache: the only module other packages import from here
(besides `imagecache.cache.ImageCache`, `imagecache.resolver.ImageResolver` and
`imagecache.core.egress.EgressPolicy`)."""

from __future__ import annotations

import msgspec


class Layer(msgspec.Struct, frozen=True):
    digest: str  # "sha256:<hex>" of the compressed blob
    size: int  # bytes of the compressed blob
    media_type: str = ""


class ImageConfig(msgspec.Struct, frozen=True):
    """The runnable part of an OCI image config."""

    entrypoint: list[str] = msgspec.field(default_factory=list)
    cmd: list[str] = msgspec.field(default_factory=list)
    env: list[str] = msgspec.field(default_factory=list)  # "KEY=value"
    working_dir: str = ""
    exposed_ports: list[str] = msgspec.field(default_factory=list)  # "8080/tcp"
    user: str = ""
    stop_signal: str = ""  # "SIGTERM", "15" or "" (the image says nothing)

    def argv_with(self, entrypoint: list[str], cmd: list[str]) -> list[str]:
        """Entrypoint + Cmd after an app's overrides, as Kubernetes' command and args: a
        new `entrypoint` drops the image's Cmd unless `cmd` is given too; `cmd` alone keeps
        the image's Entrypoint. [] when there is nothing to run."""
        if entrypoint:
            return [*entrypoint, *cmd]
        return [*self.entrypoint, *(cmd or self.cmd)]


class Image(msgspec.Struct, frozen=True):
    """A pulled and unpacked image. `digest` is the manifest digest (the image's identity)."""

    ref: str
    digest: str
    layers: list[Layer]
    config: ImageConfig
    rootfs: str  # absolute path of the unpacked, read-only-by-convention root


class LayerChange(msgspec.Struct, frozen=True):
    """A layer appeared (present=True) in or left (present=False) the cache."""

    digest: str
    size: int
    present: bool
