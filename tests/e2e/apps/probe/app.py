"""probe: a machine that reports what it can see and do from inside, for the tests of
machines as containers (tests/integration/test_oci_machines.py). Standard library only.

GET /status            its identity: uid, CapEff, Seccomp, NoNewPrivs, uid_map, hostname
GET /files?path=P      for each P: its content (first 4 KiB) or the error reading it
GET /count?path=D      entries in directory D (or the error)
GET /write?path=P&data=X   writes X to P; 200 "ok" or the error
GET /attack            each escape the tests expect refused, and what happened
GET /alloc?mb=N        allocates and touches N MiB (an OOM kill ends the machine)
GET /fork              forks sleeping children until refused; answers how many it made
GET /spin?s=S          spins one core for S seconds (answers at once)
GET /deep?n=N          makes a directory tree N levels deep under /var/deep
GET /connect?to=H:P&to=…  opens TCP to each (1 s at most): "ok" or the error's name
GET /env?name=N        the value of environment variable N (or null)
GET /sniff?s=S&needle=X    captures every frame on every interface it can see (AF_PACKET)
                       for S seconds: the interfaces, the frames, whether X was in one
GET /flood?s=S         writes lines to stdout as fast as it can for S seconds (answers at
                       once; the total it wrote is printed when it is done)
Listens on 0.0.0.0:$PROBE_PORT, else $PORT. SIGTERM and SIGUSR1 end it with status 0
after printing which signal came.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

libc = ctypes.CDLL(None, use_errno=True)
SYS_INIT_MODULE = 175
SYS_FINIT_MODULE = 313
PTRACE_ATTACH = 16
MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096
CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
NAMESPACES = {"net": 0x40000000, "pid": 0x20000000, "uts": 0x04000000, "ipc": 0x08000000,
              "cgroup": 0x02000000}
# x86_64 numbers of calls Docker's default seccomp profile refuses (EPERM), each made with
# harmless arguments: were one let through, it would fail otherwise (or succeed)
REFUSED_CALLS = {"bpf": (321, 0, None, 0), "perf_event_open": (298, None, 0, -1, -1, 0),
                 "keyctl": (250, 0, -3, 0), "add_key": (248, b"user", b"k", b"v", 1, -3),
                 "userfaultfd": (323, 0), "open_by_handle_at": (304, -1, None, 0),
                 "kexec_load": (246, 0, 0, None, 0)}


def outcome(result: int) -> str:
    """A libc call's result as "ok" or the errno's name."""
    if result == 0 or result > 0:
        return "ok"
    return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))


def attempt(action) -> str:  # type: ignore[no-untyped-def]
    try:
        action()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc))
    return "ok"


def status() -> dict[str, str]:
    fields = {}
    with open("/proc/self/status") as lines:
        for line in lines:
            key, _, value = line.partition(":")
            if key in ("CapEff", "CapBnd", "Seccomp", "NoNewPrivs", "Uid"):
                fields[key] = value.strip()
    fields["uid_map"] = read("/proc/self/uid_map").split("\n")[0].strip()
    fields["hostname"] = socket.gethostname()
    fields["pid"] = str(os.getpid())
    return fields


def read_strict(path: str) -> None:
    with open(path, "rb") as f:
        f.read(1)


def read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(4096).decode(errors="replace")
    except OSError as exc:
        return "error: " + errno.errorcode.get(exc.errno or 0, str(exc))


def write(path: str, data: str) -> None:
    with open(path, "w") as out:
        out.write(data)


def attacks() -> dict[str, str]:
    block = "/tmp/probe-sda"
    child = os.fork()
    if child == 0:
        time.sleep(30)
        os._exit(0)
    try:
        ptrace = outcome(libc.ptrace(PTRACE_ATTACH, child, None, None))
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    return {
        "mknod_block": attempt(lambda: os.mknod(block, 0o600 | 0o60000, os.makedev(8, 0))),
        "mount_block": outcome(libc.mount(b"/dev/vda", b"/mnt", b"ext4", 0, None)),
        "mount_tmpfs": outcome(libc.mount(b"none", b"/mnt", b"tmpfs", 0, None)),
        "remount_root_rw": outcome(libc.mount(b"none", b"/", None, MS_REMOUNT | MS_BIND, None)),
        "remount_sys_rw": outcome(libc.mount(b"none", b"/sys", None, MS_REMOUNT, None)),
        "unshare_user": outcome(libc.unshare(CLONE_NEWUSER)),
        "unshare_mount": outcome(libc.unshare(CLONE_NEWNS)),
        "ptrace_child": ptrace,
        "init_module": outcome(libc.syscall(SYS_INIT_MODULE, None, 0, b"")),
        "finit_module": outcome(libc.syscall(SYS_FINIT_MODULE, 0, b"", 0)),
        "write_proc_sys": attempt(lambda: write("/proc/sys/kernel/hostname", "x")),
        "open_kcore": attempt(lambda: read_strict("/proc/kcore")),
        **{f"unshare_{name}": outcome(libc.unshare(flag)) for name, flag in NAMESPACES.items()},
        **{name: outcome(libc.syscall(*call)) for name, call in REFUSED_CALLS.items()},
    }


def fork_until_refused() -> int:
    """Start small processes (sh waiting on a pipe) until the kernel refuses one."""
    reader, writer = os.pipe()
    children = []
    try:
        while len(children) < 100_000:
            try:
                children.append(os.posix_spawn("/bin/sh", ["sh", "-c", "read x"], {},
                                               file_actions=[(os.POSIX_SPAWN_DUP2, reader, 0)]))
            except OSError:
                break
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
        for pid in children:
            os.waitpid(pid, 0)
        os.close(reader)
        os.close(writer)
    return len(children)


def deep(levels: int) -> None:
    os.makedirs("/var/deep", exist_ok=True)
    fd = os.open("/var/deep", os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(levels):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(fd)


def flood(seconds: float) -> None:
    line = b"X" * 200 + b"\n"
    chunk = line * 300
    end = time.monotonic() + seconds
    written = 0
    while time.monotonic() < end:
        written += os.write(1, chunk)
    os.write(1, f"flood wrote {written} bytes\n".encode())


def spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def connect(target: str) -> str:
    host, _, port = target.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=1.0).close()
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc))
    return "ok"


def sniff(seconds: float, needle: bytes) -> dict[str, object]:
    """Every frame AF_PACKET shows this machine for `seconds` (ETH_P_ALL, all interfaces)."""
    try:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0003))
    except OSError as exc:
        return {"error": errno.errorcode.get(exc.errno or 0, str(exc))}
    frames, seen, interfaces = 0, False, set()
    sock.settimeout(0.1)
    end = time.monotonic() + seconds
    with sock:
        while time.monotonic() < end:
            try:
                frame, address = sock.recvfrom(65535)
            except TimeoutError:
                continue
            frames += 1
            interfaces.add(address[0])
            seen = seen or needle in frame
    return {"frames": frames, "seen": seen, "interfaces": sorted(interfaces),
            "all_interfaces": sorted(name for _, name in socket.if_nameindex())}


class Probe(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        paths = parse_qs(url.query).get("path", [])
        if url.path == "/status":
            self.answer(status())
        elif url.path == "/files":
            self.answer({p: read(p) for p in paths})
        elif url.path == "/count":
            self.answer({p: len(os.listdir(p)) if os.path.isdir(p) else read(p) for p in paths})
        elif url.path == "/write":
            self.answer({"write": attempt(lambda: write(query["path"], query.get("data", "")))})
        elif url.path == "/attack":
            self.answer(attacks())
        elif url.path == "/alloc":
            held = bytearray(int(query["mb"]) << 20)
            for i in range(0, len(held), 4096):
                held[i] = 1
            self.answer({"allocated_mb": len(held) >> 20})
        elif url.path == "/fork":
            self.answer({"forked": fork_until_refused()})
        elif url.path == "/deep":
            deep(int(query["n"]))
            self.answer({"deep": int(query["n"])})
        elif url.path == "/connect":
            self.answer({t: connect(t) for t in parse_qs(url.query).get("to", [])})
        elif url.path == "/env":
            self.answer({"value": os.environ.get(query["name"])})
        elif url.path == "/sniff":
            self.answer(sniff(float(query["s"]), query.get("needle", "").encode()))
        elif url.path == "/flood":
            threading.Thread(target=flood, args=(float(query["s"]),), daemon=True).start()
            self.answer({"flooding": True})
        elif url.path == "/spin":
            threading.Thread(target=spin, args=(float(query["s"]),), daemon=True).start()
            self.answer({"spinning": True})
        else:
            self.answer({"hello": os.environ.get("THAW_MACHINE_ID", "")})

    def answer(self, value: object) -> None:
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    port = int(os.environ.get("PROBE_PORT") or os.environ.get("PORT", "8080"))
    server = ThreadingHTTPServer(("0.0.0.0", port), Probe)
    server.daemon_threads = True

    def bye(signum: int, _frame: object) -> None:
        print(f"probe got {signal.Signals(signum).name}", flush=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, bye)
    signal.signal(signal.SIGUSR1, bye)
    print(f"probe listening on {port}", flush=True)
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
