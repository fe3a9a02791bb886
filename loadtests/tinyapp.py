"""An OCI image of loadtests/apps/tinyhttp.c: a machine whose boot costs about a millisecond
of CPU, for benchmarks where many machines boot at once on a small host (a Python app's
interpreter start-up would measure the host's CPU starvation instead of the platform).

The binary is linked dynamically against the host's libc: the machine sandbox binds the
host's /usr and /lib read-only, and without the sandbox it runs on the host itself.
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
        subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-o", str(root / BINARY),
                        str(SOURCE)], check=True, timeout=60)
        # Relative to the working directory, the image's root (as `python3 app.py` is):
        # /app in the sandbox, the unpacked rootfs without it.
        build_image(root, tag, layout=layout, overrides=BuildOverrides(entrypoint=[f"./{BINARY}"]))
    return f"oci:{layout}:{split_name_tag(tag)[1]}"
