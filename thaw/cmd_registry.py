"""The services' registry flags (`--registry`, its password file and CA) and the
operator's `thaw redis-acl`, which prints the Redis ACL of a role (ground/registry/acl.py)."""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from ground.auth.secrets_files import read_secret

if TYPE_CHECKING:
    from thaw.cmdbase import Sub


def add_registry_flags(p: argparse.ArgumentParser) -> None:
    env = os.environ.get
    p.add_argument("--registry", default=env("THAW_REGISTRY", "memory"),
                   help="the shared view: memory (one process), redis://[USER@]HOST:PORT/DB, "
                        "rediss://… (TLS) or unix://PATH")
    p.add_argument("--registry-password-file", type=Path, metavar="PATH",
                   default=optional_path(env("THAW_REGISTRY_PASSWORD_FILE", "")),
                   help="the Redis user's password (a 0600 file; else in the URL, or none)")
    p.add_argument("--registry-cacert", type=Path, metavar="PATH",
                   default=optional_path(env("THAW_REGISTRY_CACERT", "")),
                   help="the CA (PEM) a rediss:// server's certificate must chain to "
                        "(default: the system's)")


def optional_path(text: str) -> Path | None:
    return Path(text) if text else None


async def registry_url(args: argparse.Namespace, role: str, worker: str = "") -> str:
    """The registry URL with its credentials, once Redis has accepted the role's user
    (RegistryRefused, a ValueError, if it did not)."""
    from ground.registry.access import check_access, with_credentials

    url = with_credentials(args.registry, password_file=args.registry_password_file,
                           ca_file=args.registry_cacert)
    await check_access(url, role, worker)
    return url


def add(sub: Sub) -> None:
    p = sub.add_parser("redis-acl", help="print the Redis ACL user of a role (edge, agent, "
                                          "placement) for an ACL file or ACL SETUSER")
    p.add_argument("--role", required=True, choices=["edge", "agent", "placement"],
                   help="the service the user is for")
    p.add_argument("--user", default="", help="the user's name (default: the role's)")
    p.add_argument("--worker", default="",
                   help="agent only: confine the user to this worker id's own keys")
    p.add_argument("--password-file", type=Path, required=True, metavar="PATH",
                   help="the user's password (a 0600 file); only its SHA-256 is printed")
    p.add_argument("--format", choices=["aclfile", "command"], default="aclfile",
                   help="a line of an ACL file (default), or an ACL SETUSER command line "
                        "for redis-cli")
    p.set_defaults(run=print_acl)


def print_acl(args: argparse.Namespace) -> int:
    from ground.registry import acl

    user = args.user or (f"agent-{args.worker}" if args.worker else args.role)
    password = read_secret(args.password_file)
    line = acl.acl_file_line(user, args.role, password, args.worker)
    if args.format == "command":
        rules = acl.rules(args.role, acl.password_sha256(password), args.worker)
        line = shlex.join(["ACL", "SETUSER", user, *rules])
    print(line)
    return 0
