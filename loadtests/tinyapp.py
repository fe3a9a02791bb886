"""An OCI image of loadtests/apps/tinyhttp.c: a machine whose boot costs about a millisecond
of CPU, for benchmarks where many machines boot at once on a small host (a Python app's
interpreter start-up would measure the host's CPU starvation instead of the platform).

The binary is linked statically: a machine is an OCI container with the image's own
rootfs, which has no libc (linked against the host's, it failed with "exec ./tinyhttp:
no such file or directory" — its loader is not there).
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from thaw.imagebuild import BuildOverrides, build_image, split_name_tag

SOURCE = Path(__file__).resolve().parent / "apps" / "tinyhttp.c"
BINARY = "tinyhttp"


def build_tiny_image(layout: Path, tag: str = "tiny:v1") -> str:
    """Compile tinyhttp.c and write it as image `tag` into the OCI layout `layout`;
    return the reference a machine is created with (`oci:LAYOUT:TAG`)."""
    with tempfile.TemporaryDirectory(prefix="thaw-tiny-") as temp:
        root = Path(temp) / "image"
        root.mkdir()
        subprocess.run(["gcc", "-O2", "-static", "-Wall", "-Wextra", "-o", str(root / BINARY),
                        str(SOURCE)], check=True, timeout=60)
        # Relative to the working directory, the image's root (as `python3 app.py` is):
        # /app in the sandbox, the unpacked rootfs without it.
        build_image(root, tag, layout=layout, overrides=BuildOverrides(entrypoint=[f"./{BINARY}"]))
    return f"oci:{layout}:{split_name_tag(tag)[1]}"
