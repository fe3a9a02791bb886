"""Which syscalls a machine's processes may make: the OCI `linux.seccomp` object.

Decides the seccomp filter runc installs in a machine: Docker's default profile
(`agent.core.seccomp_table`, moby/profiles/seccomp v0.2.3) resolved for the
container's capabilities and the host's architecture the way dockerd resolves
it, then this host's deviations (`PTRACE_NEEDS_CAP_SYS_PTRACE`,
`SOCKETCALL_ANSWERS_ENOSYS`). Invariants: anything not listed fails with EPERM;
the result never allows a call Docker's profile would refuse for the same
capabilities and architecture; rules keep the table's order. It must not know the running
kernel, libseccomp or runc: the host kernel is assumed to be at least
`HOST_KERNEL`, and the object is plain JSON-shaped data for config.json.
"""

from __future__ import annotations

from dataclasses import replace

from agent.core.seccomp_table import (
    ARCH_MAP,
    DEFAULT_ACTION,
    DEFAULT_ERRNO_RET,
    ENOSYS,
    ERRNO,
    RULES,
    Arg,
    Rule,
    When,
)

# The oldest kernel a host runs (version, major revision): moby's `minKernel`
# conditions are read against it.
HOST_KERNEL = (5, 10)

# `uname -m` of a host → libseccomp's name for it, which moby's `arches` use.
NATIVE_ARCH = {
    "x86_64": "amd64",
    "aarch64": "arm64",
    "s390x": "s390x",
    "ppc64le": "ppc64le",
    "riscv64": "riscv64",
}

# Deviation: Docker lets every container ptrace and read or write another
# process's memory (process_vm_*) on kernels >= 4.8, where ptrace can no longer
# slip past seccomp. Here machines of different tenants share a kernel, and
# ptrace is a large, bug-prone kernel surface (e.g. PTRACE_TRACEME,
# CVE-2019-13272) that a served application does not need; debuggers and
# profilers (strace, gdb, py-spy) can ask for CAP_SYS_PTRACE, as Docker
# already requires for kcmp, pidfd_getfd and process_madvise.
PTRACE_NEEDS_CAP_SYS_PTRACE = frozenset({"ptrace", "process_vm_readv", "process_vm_writev", "kcmp"})

# Deviation: the table keeps AF_ALG and AF_VSOCK sockets away by reading
# socket(2)'s first argument, but a 32-bit x86 call (even `int 0x80` from a
# 64-bit program) reaches socket() through socketcall(2), whose arguments are in
# memory where seccomp cannot read them: under Docker's rules such a call opened
# an AF_VSOCK socket in a runc container here, and vsock is not confined by the
# network namespace. Docker closes the AF_ALG half of that path with AppArmor
# (`deny network alg`); hosts here run no LSM profile, so socketcall answers
# ENOSYS, as in
# moby/profiles/seccomp v0.2.2. ENOSYS, not EPERM: runc drops a rule whose
# action is the default one. 32-bit programs keep the direct socket syscalls
# (Linux >= 4.3); a 32-bit libc that only knows socketcall loses sockets.
SOCKETCALL_ANSWERS_ENOSYS = Rule(("socketcall",), action=ERRNO, errno_ret=ENOSYS)


def default_profile(capabilities: frozenset[str], arch: str = "x86_64") -> dict[str, object]:
    """OCI linux.seccomp: Docker's default allow-list as moby's profiles/seccomp/default.json
    resolves it for a container with `capabilities` (names like "CAP_CHOWN") on `arch`.

    `capabilities` is the bounding set, as dockerd reads it; `arch` is `uname -m`
    (one of `NATIVE_ARCH`); another raises ValueError.
    """
    return resolve(host_rules(), capabilities, arch)


def resolve(rules: tuple[Rule, ...], capabilities: frozenset[str], arch: str) -> dict[str, object]:
    """OCI linux.seccomp from moby-style `rules`, as dockerd's setupSeccomp builds it."""
    native = native_arch(arch)
    return {
        "defaultAction": DEFAULT_ACTION,
        "defaultErrnoRet": DEFAULT_ERRNO_RET,
        "architectures": list(ARCH_MAP.get(native, ())),
        "syscalls": [_oci_syscall(r) for r in rules if _applies(r, capabilities, native)],
    }


def native_arch(arch: str) -> str:
    if arch not in NATIVE_ARCH:
        raise ValueError(f"no seccomp profile for architecture {arch!r}")
    return NATIVE_ARCH[arch]


def host_rules() -> tuple[Rule, ...]:
    """Docker's rules with this host's deviations, still unresolved."""
    kept = (_without_ptrace(_without_socketcall(r)) for r in RULES)
    return (*(r for r in kept if r.names), SOCKETCALL_ANSWERS_ENOSYS)


def _without_ptrace(rule: Rule) -> Rule:
    if rule.includes is not None and "CAP_SYS_PTRACE" in rule.includes.caps:
        return rule
    return _without(rule, PTRACE_NEEDS_CAP_SYS_PTRACE)


def _without_socketcall(rule: Rule) -> Rule:
    return _without(rule, SOCKETCALL_ANSWERS_ENOSYS.names)


def _without(rule: Rule, names: frozenset[str] | tuple[str, ...]) -> Rule:
    return replace(rule, names=tuple(n for n in rule.names if n not in names))


def _applies(rule: Rule, capabilities: frozenset[str], native: str) -> bool:
    """moby's setupSeccomp: any excludes condition met drops the rule; every
    includes condition must be met (all of its caps) to keep it."""
    excluded = rule.excludes is not None and _any_met(rule.excludes, capabilities, native)
    included = rule.includes is None or _all_met(rule.includes, capabilities, native)
    return included and not excluded


def _any_met(when: When, capabilities: frozenset[str], native: str) -> bool:
    return (
        native in when.arches
        or bool(when.caps & capabilities)
        or (when.min_kernel is not None and when.min_kernel <= HOST_KERNEL)
    )


def _all_met(when: When, capabilities: frozenset[str], native: str) -> bool:
    return (
        (not when.arches or native in when.arches)
        and when.caps <= capabilities
        and (when.min_kernel is None or when.min_kernel <= HOST_KERNEL)
    )


def _oci_syscall(rule: Rule) -> dict[str, object]:
    syscall: dict[str, object] = {"names": list(rule.names), "action": rule.action}
    if rule.errno_ret is not None:
        syscall["errnoRet"] = rule.errno_ret
    if rule.args:
        syscall["args"] = [_oci_arg(a) for a in rule.args]
    return syscall


def _oci_arg(arg: Arg) -> dict[str, object]:
    return {"index": arg.index, "value": arg.value, "valueTwo": arg.value_two, "op": arg.op}

