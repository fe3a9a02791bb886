"""The machines' seccomp filter is Docker's default profile, resolved as dockerd
resolves it, with this host's two named deviations."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agent.core.seccomp import (
    PTRACE_NEEDS_CAP_SYS_PTRACE,
    SOCKETCALL_ANSWERS_ENOSYS,
    default_profile,
    resolve,
)
from agent.core.seccomp_table import ALLOWED_TO_ALL, RULES

PODMAN_CAPS = frozenset(
    {
        "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
        "CAP_NET_BIND_SERVICE", "CAP_SETFCAP", "CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID",
        "CAP_SYS_CHROOT",
    }
)  # fmt: skip
EVERY_CAP = PODMAN_CAPS | {
    "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_PTRACE", "CAP_SYS_MODULE", "CAP_SYS_PACCT",
    "CAP_SYS_RAWIO", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_SYS_NICE", "CAP_SYSLOG",
    "CAP_BPF", "CAP_PERFMON", "CAP_DAC_READ_SEARCH", "CAP_NET_ADMIN", "CAP_NET_RAW",
}  # fmt: skip
CAP_SETS = [frozenset(), PODMAN_CAPS, PODMAN_CAPS | {"CAP_SYS_ADMIN"}, EVERY_CAP]
ARCHES = ["x86_64", "aarch64", "s390x", "ppc64le", "riscv64"]

ACTIONS = {
    "SCMP_ACT_ALLOW", "SCMP_ACT_ERRNO", "SCMP_ACT_KILL", "SCMP_ACT_KILL_PROCESS",
    "SCMP_ACT_KILL_THREAD", "SCMP_ACT_TRAP", "SCMP_ACT_TRACE", "SCMP_ACT_LOG",
    "SCMP_ACT_NOTIFY",
}  # fmt: skip
OPS: dict[str, Callable[[int, int, int], bool]] = {
    "SCMP_CMP_NE": lambda a, v, _: a != v,
    "SCMP_CMP_LT": lambda a, v, _: a < v,
    "SCMP_CMP_LE": lambda a, v, _: a <= v,
    "SCMP_CMP_EQ": lambda a, v, _: a == v,
    "SCMP_CMP_GE": lambda a, v, _: a >= v,
    "SCMP_CMP_GT": lambda a, v, _: a > v,
    "SCMP_CMP_MASKED_EQ": lambda a, mask, want: a & mask == want,
}

# What pthread_create (glibc) passes to clone(2): VM|FS|FILES|SIGHAND|THREAD|SYSVSEM|
# SETTLS|PARENT_SETTID|CHILD_CLEARTID.
THREAD_CLONE_FLAGS = 0x3D0F00
SIGCHLD = 17  # fork() through clone(2)
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000


def _entries(profile: dict[str, object]) -> list[dict[str, Any]]:
    syscalls = profile["syscalls"]
    assert isinstance(syscalls, list)
    return syscalls


def _naming(profile: dict[str, object], name: str) -> Iterator[dict[str, Any]]:
    return (e for e in _entries(profile) if name in e["names"])


def _allows(profile: dict[str, object], name: str, *argv: int) -> bool:
    """Some ALLOW entry for `name` whose argument comparisons all hold for `argv`."""
    return any(
        e["action"] == "SCMP_ACT_ALLOW"
        and all(
            OPS[a["op"]](argv[a["index"]], a["value"], a["valueTwo"])
            for a in e.get("args", [])
        )
        for e in _naming(profile, name)
    )


def _allowed_unconditionally(profile: dict[str, object], name: str) -> bool:
    return any(e["action"] == "SCMP_ACT_ALLOW" and "args" not in e for e in _naming(profile, name))


def _allow_pairs(profile: dict[str, object]) -> set[tuple[str, str]]:
    """(syscall, its argument filters as JSON) for every allowed name."""
    return {
        (name, json.dumps(e.get("args", []), sort_keys=True))
        for e in _entries(profile)
        if e["action"] == "SCMP_ACT_ALLOW"
        for name in e["names"]
    }


def test_the_table_transcribes_moby_s_33_rules_and_361_names_allowed_to_all() -> None:
    assert len(RULES) == 33
    assert len(ALLOWED_TO_ALL) == len(set(ALLOWED_TO_ALL)) == 361
    assert RULES[0].names == ALLOWED_TO_ALL


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("caps", CAP_SETS, ids=["none", "podman", "sys_admin", "every"])
def test_profile_is_valid_oci_shape(caps: frozenset[str], arch: str) -> None:
    profile = default_profile(caps, arch)
    assert json.loads(json.dumps(profile)) == profile
    assert set(profile) == {"defaultAction", "defaultErrnoRet", "architectures", "syscalls"}
    assert (profile["defaultAction"], profile["defaultErrnoRet"]) == ("SCMP_ACT_ERRNO", 1)
    for entry in _entries(profile):
        assert set(entry) <= {"names", "action", "errnoRet", "args"}
        names = entry["names"]
        assert isinstance(names, list) and names and all(isinstance(n, str) for n in names)
        assert entry["action"] in ACTIONS
        if "errnoRet" in entry:
            assert entry["action"] == "SCMP_ACT_ERRNO" and entry["errnoRet"] != 1
        for arg in entry.get("args", []):
            assert set(arg) == {"index", "value", "valueTwo", "op"}
            assert arg["op"] in OPS and 0 <= arg["index"] <= 5
            assert 0 <= arg["value"] < 2**64 and 0 <= arg["valueTwo"] < 2**64


def test_x86_64_filters_its_32_bit_and_x32_abis_too() -> None:
    assert default_profile(PODMAN_CAPS)["architectures"] == [
        "SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32",
    ]  # fmt: skip
    assert default_profile(PODMAN_CAPS, "aarch64")["architectures"] == [
        "SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM",
    ]  # fmt: skip


def test_an_architecture_without_a_profile_is_refused() -> None:
    with pytest.raises(ValueError, match="sparc64"):
        default_profile(PODMAN_CAPS, "sparc64")


def test_arch_specific_syscalls_are_allowed_only_on_their_architecture() -> None:
    x86, arm = default_profile(PODMAN_CAPS, "x86_64"), default_profile(PODMAN_CAPS, "aarch64")
    assert _allowed_unconditionally(x86, "arch_prctl")
    assert _allowed_unconditionally(x86, "modify_ldt")
    assert not _allowed_unconditionally(arm, "arch_prctl")
    assert _allowed_unconditionally(arm, "set_tls")
    assert not _allowed_unconditionally(x86, "set_tls")


def test_the_common_syscalls_a_python_server_needs_are_allowed() -> None:
    profile = default_profile(PODMAN_CAPS)
    needed = [
        "read", "write", "openat", "close", "fstat", "newfstatat", "statx", "lseek", "mmap",
        "munmap", "mprotect", "mremap", "madvise", "brk", "futex", "rt_sigaction",
        "rt_sigprocmask", "rt_sigreturn", "sigaltstack", "epoll_create1", "epoll_ctl",
        "epoll_wait", "epoll_pwait", "accept4", "bind", "listen", "connect", "sendto",
        "recvfrom", "sendmsg", "recvmsg", "setsockopt", "getsockopt", "getsockname",
        "getpeername", "shutdown", "socketpair", "pipe2", "eventfd2", "getrandom", "ioctl",
        "fcntl", "dup2", "dup3", "execve", "wait4", "exit_group", "set_robust_list", "rseq",
        "set_tid_address", "prlimit64", "clock_gettime", "clock_nanosleep", "getpid", "gettid",
        "getcwd", "getdents64", "readlink", "sched_getaffinity", "uname", "kill", "tgkill",
        "vfork", "arch_prctl",
    ]  # fmt: skip
    refused = [name for name in needed if not _allowed_unconditionally(profile, name)]
    assert refused == []
    assert _allows(profile, "clone", THREAD_CLONE_FLAGS)
    assert _allows(profile, "clone", SIGCHLD)
    for family in (1, 2, 10, 16):  # AF_UNIX, AF_INET, AF_INET6, AF_NETLINK
        assert _allows(profile, "socket", family)


def test_mount_and_kexec_are_not_in_the_allow_list_without_cap_sys_admin() -> None:
    profile = default_profile(PODMAN_CAPS)
    for name in ("mount", "umount2", "fsopen", "move_mount", "kexec_load", "kexec_file_load",
                 "unshare", "setns", "bpf", "perf_event_open", "sethostname"):  # fmt: skip
        assert list(_naming(profile, name)) == [], name
    assert _allowed_unconditionally(default_profile(PODMAN_CAPS | {"CAP_SYS_ADMIN"}), "mount")


def test_kexec_and_swapon_are_refused_even_with_every_capability() -> None:
    profile = default_profile(EVERY_CAP)
    for name in ("kexec_load", "kexec_file_load", "swapon", "pivot_root", "userfaultfd"):
        assert list(_naming(profile, name)) == [], name


def test_clone_with_namespace_flags_is_filtered_without_cap_sys_admin() -> None:
    profile = default_profile(PODMAN_CAPS)
    assert not _allowed_unconditionally(profile, "clone")
    assert not _allows(profile, "clone", THREAD_CLONE_FLAGS | CLONE_NEWUSER)
    assert not _allows(profile, "clone", SIGCHLD | CLONE_NEWNET)
    assert _allows(profile, "clone", THREAD_CLONE_FLAGS)
    admin = default_profile(PODMAN_CAPS | {"CAP_SYS_ADMIN"})
    assert _allows(admin, "clone", SIGCHLD | CLONE_NEWUSER)


def test_clone_flags_are_read_from_the_second_argument_on_s390x() -> None:
    profile = default_profile(PODMAN_CAPS, "s390x")
    [clone] = _naming(profile, "clone")
    assert clone["args"] == [
        {"index": 1, "value": 0x7E020000, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}
    ]


def test_clone3_answers_enosys_without_cap_sys_admin_so_libc_falls_back_to_clone() -> None:
    [clone3] = _naming(default_profile(PODMAN_CAPS), "clone3")
    assert clone3 == {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}
    admin = default_profile(PODMAN_CAPS | {"CAP_SYS_ADMIN"})
    assert [e["action"] for e in _naming(admin, "clone3")] == ["SCMP_ACT_ALLOW"]


def test_reboot_is_allowed_only_with_cap_sys_boot() -> None:
    assert list(_naming(default_profile(EVERY_CAP - {"CAP_SYS_BOOT"}), "reboot")) == []
    assert _allowed_unconditionally(default_profile(PODMAN_CAPS | {"CAP_SYS_BOOT"}), "reboot")


@pytest.mark.parametrize(
    ("cap", "syscall"),
    [
        ("CAP_SYS_CHROOT", "chroot"), ("CAP_SYS_MODULE", "init_module"),
        ("CAP_SYS_PACCT", "acct"), ("CAP_SYS_RAWIO", "iopl"), ("CAP_SYS_TIME", "clock_settime"),
        ("CAP_SYS_TTY_CONFIG", "vhangup"), ("CAP_SYS_NICE", "mbind"), ("CAP_SYSLOG", "syslog"),
        ("CAP_BPF", "bpf"), ("CAP_PERFMON", "perf_event_open"),
        ("CAP_DAC_READ_SEARCH", "open_by_handle_at"), ("CAP_SYS_PTRACE", "pidfd_getfd"),
    ],
)  # fmt: skip
def test_each_capability_gated_syscall_is_allowed_only_with_its_capability(
    cap: str, syscall: str
) -> None:
    assert not _allowed_unconditionally(default_profile(PODMAN_CAPS - {cap}), syscall)
    assert _allowed_unconditionally(default_profile(PODMAN_CAPS | {cap}), syscall)


def test_ptrace_needs_cap_sys_ptrace() -> None:
    without, with_ptrace = default_profile(PODMAN_CAPS), default_profile(
        PODMAN_CAPS | {"CAP_SYS_PTRACE"}
    )
    for name in ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp"):
        assert name in PTRACE_NEEDS_CAP_SYS_PTRACE
        assert list(_naming(without, name)) == [], name
        assert _allowed_unconditionally(with_ptrace, name), name


def test_docker_itself_allows_ptrace_on_the_assumed_host_kernel() -> None:
    # The deviation above is ours: moby's minKernel 4.8 rule applies on hosts >= 5.x.
    assert _allowed_unconditionally(resolve(RULES, PODMAN_CAPS, "x86_64"), "ptrace")


def test_socket_allows_every_address_family_but_af_alg_and_af_vsock() -> None:
    profile = default_profile(PODMAN_CAPS)
    refused = [family for family in range(64) if not _allows(profile, "socket", family)]
    assert refused == [38, 40]


def test_socketcall_answers_enosys_so_the_socket_family_filter_cannot_be_bypassed() -> None:
    profile = default_profile(PODMAN_CAPS)
    [socketcall] = _naming(profile, "socketcall")
    assert socketcall == {"names": ["socketcall"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}
    assert SOCKETCALL_ANSWERS_ENOSYS.errno_ret == 38
    assert _allowed_unconditionally(resolve(RULES, PODMAN_CAPS, "x86_64"), "socketcall")


def test_personality_is_allowed_only_for_docker_s_five_personas() -> None:
    profile = default_profile(PODMAN_CAPS)
    for persona in (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF):
        assert _allows(profile, "personality", persona), hex(persona)
    for persona in (0x0040000, 0x0400000, 0x4000000):  # ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC…
        assert not _allows(profile, "personality", persona), hex(persona)


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("caps", CAP_SETS, ids=["none", "podman", "sys_admin", "every"])
def test_the_profile_differs_from_docker_s_only_by_the_named_deviations(
    caps: frozenset[str], arch: str
) -> None:
    ours, docker = default_profile(caps, arch), resolve(RULES, caps, arch)
    assert _allow_pairs(ours) <= _allow_pairs(docker)
    withheld = {name for name, _ in _allow_pairs(docker) - _allow_pairs(ours)}
    deviations = set(SOCKETCALL_ANSWERS_ENOSYS.names)
    if "CAP_SYS_PTRACE" not in caps:
        deviations |= PTRACE_NEEDS_CAP_SYS_PTRACE
    assert withheld <= deviations
    assert ours["architectures"] == docker["architectures"]
