"""App-owner and operator commands (placement's API): how they are added and run.

Each command's module adds its parsers and names its function (`set_defaults(run=…)`):
thaw/cmd_apps.py (apps, launch, deploy, scale, releases), thaw/cmd_machines.py
(machines, logs, placements), thaw/cmd_secrets.py (secrets), thaw/cmd_admin.py
(status, tokens). Every one takes `--api`, `--token` and `--json` (thaw/cmdbase.py).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from ground.appconfig import InvalidConfig
from thaw import cmd_admin, cmd_apps, cmd_context, cmd_machines, cmd_secrets
from thaw.client import ApiError
from thaw.cmdbase import LOCAL_TOKEN, common_flags
from thaw.contexts import ContextError

if TYPE_CHECKING:
    from thaw.cmdbase import Sub


def add_client_commands(sub: Sub, env: Any) -> None:
    common = common_flags(env)
    for module in (cmd_apps, cmd_machines, cmd_secrets, cmd_admin, cmd_context):
        module.add(sub, common)


def run_client_command(args: argparse.Namespace) -> int:
    try:
        code: int = args.run(args)
        return code
    except ContextError as exc:
        print(f"thaw {args.command}: {exc}", file=sys.stderr)
        return 2
    except InvalidConfig as exc:
        what = "invalid config" if args.command in ("apps", "deploy", "launch") \
            else "invalid value"
        print(f"{what}: {exc.field}: {exc.reason}", file=sys.stderr)
        return 2
    except ApiError as exc:
        print(f"thaw {args.command}: {exc}", file=sys.stderr)
        if exc.status == 401:
            print(f"  (pass --token, set THAW_TOKEN, use a context that names its token "
                  f"file — `thaw context list` — or run where ./{LOCAL_TOKEN} is)",
                  file=sys.stderr)
        return 1
