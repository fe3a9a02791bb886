"""Docker's default seccomp profile, as data.

A transcription of moby's `profiles/seccomp/default.json` at
github.com/moby/profiles/seccomp v0.2.3, the version vendored by moby/moby at
commit b985e2313a8676e18072b442911fc8f64f17d440 (August 2026): the same rules,
in the same order, with the same `includes`/`excludes` conditions. Only the
Linux seccomp data lives here; `agent.core.seccomp` resolves the conditions for
one container and holds this host's deviations. Invariants: nothing here resolves
a condition, and a rule's fields mean what they mean in moby's JSON.
"""

from __future__ import annotations

from dataclasses import dataclass

ALLOW = "SCMP_ACT_ALLOW"
ERRNO = "SCMP_ACT_ERRNO"

EPERM = 1
ENOSYS = 38

AF_ALG = 38  # the kernel crypto API: a privilege-escalation surface (CVE-2026-31431)
AF_VSOCK = 40  # sockets to the hypervisor

# CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER
# | CLONE_NEWPID | CLONE_NEWNET: clone(2) with none of them set is a plain fork
# or thread.
CLONE_NAMESPACE_FLAGS = 0x7E020000

PER_LINUX = 0x0000
PER_LINUX32 = 0x0008
UNAME26 = 0x0020000
PERSONALITY_QUERY = 0xFFFFFFFF  # personality(0xffffffff) reads, never sets


@dataclass(frozen=True)
class Arg:
    """One comparison of syscall argument `index` (0-5); for SCMP_CMP_MASKED_EQ
    `value` is the mask and `value_two` what the masked argument must equal."""

    index: int
    value: int
    op: str
    value_two: int = 0


@dataclass(frozen=True)
class When:
    """A condition on the container and host, as moby's `includes`/`excludes`.

    `arches` are libseccomp's native names ("amd64", "arm64", "s390x"...);
    `min_kernel` is (version, major revision).
    """

    caps: frozenset[str] = frozenset()
    arches: frozenset[str] = frozenset()
    min_kernel: tuple[int, int] | None = None


@dataclass(frozen=True)
class Rule:
    names: tuple[str, ...]
    action: str = ALLOW
    errno_ret: int | None = None
    args: tuple[Arg, ...] = ()
    includes: When | None = None
    excludes: When | None = None


DEFAULT_ACTION = ERRNO
DEFAULT_ERRNO_RET = EPERM

# The host's native architecture (libseccomp's name) and the architectures the
# filter covers there: moby's `archMap`.
ARCH_MAP: dict[str, tuple[str, ...]] = {
    "amd64": ("SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"),
    "arm64": ("SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"),
    "mips64": ("SCMP_ARCH_MIPS64", "SCMP_ARCH_MIPS", "SCMP_ARCH_MIPS64N32"),
    "mips64n32": ("SCMP_ARCH_MIPS64N32", "SCMP_ARCH_MIPS", "SCMP_ARCH_MIPS64"),
    "mipsel64": ("SCMP_ARCH_MIPSEL64", "SCMP_ARCH_MIPSEL", "SCMP_ARCH_MIPSEL64N32"),
    "mips3l64n32": ("SCMP_ARCH_MIPSEL64N32", "SCMP_ARCH_MIPSEL", "SCMP_ARCH_MIPSEL64"),
    "s390x": ("SCMP_ARCH_S390X", "SCMP_ARCH_S390"),
    "riscv64": ("SCMP_ARCH_RISCV64",),
    "loong64": ("SCMP_ARCH_LOONGARCH64",),
}

# The first rule of the profile: allowed to every container.
ALLOWED_TO_ALL = (
    "accept", "accept4", "access", "adjtimex", "alarm", "bind", "brk", "cachestat", "capget",
    "capset", "chdir", "chmod", "chown", "chown32", "clock_adjtime", "clock_adjtime64",
    "clock_getres", "clock_getres_time64", "clock_gettime", "clock_gettime64",
    "clock_nanosleep", "clock_nanosleep_time64", "close", "close_range", "connect",
    "copy_file_range", "creat", "dup", "dup2", "dup3", "epoll_create", "epoll_create1",
    "epoll_ctl", "epoll_ctl_old", "epoll_pwait", "epoll_pwait2", "epoll_wait",
    "epoll_wait_old", "eventfd", "eventfd2", "execve", "execveat", "exit", "exit_group",
    "faccessat", "faccessat2", "fadvise64", "fadvise64_64", "fallocate", "fanotify_mark",
    "fchdir", "fchmod", "fchmodat", "fchmodat2", "fchown", "fchown32", "fchownat", "fcntl",
    "fcntl64", "fdatasync", "fgetxattr", "flistxattr", "flock", "fork", "fremovexattr",
    "fsetxattr", "fstat", "fstat64", "fstatat64", "fstatfs", "fstatfs64", "fsync", "ftruncate",
    "ftruncate64", "futex", "futex_requeue", "futex_time64", "futex_wait", "futex_waitv",
    "futex_wake", "futimesat", "getcpu", "getcwd", "getdents", "getdents64", "getegid",
    "getegid32", "geteuid", "geteuid32", "getgid", "getgid32", "getgroups", "getgroups32",
    "getitimer", "getpeername", "getpgid", "getpgrp", "getpid", "getppid", "getpriority",
    "getrandom", "getresgid", "getresgid32", "getresuid", "getresuid32", "getrlimit",
    "get_robust_list", "getrusage", "getsid", "getsockname", "getsockopt", "get_thread_area",
    "gettid", "gettimeofday", "getuid", "getuid32", "getxattr", "getxattrat",
    "inotify_add_watch", "inotify_init", "inotify_init1", "inotify_rm_watch", "io_cancel",
    "ioctl", "io_destroy", "io_getevents", "io_pgetevents", "io_pgetevents_time64",
    "ioprio_get", "ioprio_set", "io_setup", "io_submit", "ipc", "kill", "landlock_add_rule",
    "landlock_create_ruleset", "landlock_restrict_self", "lchown", "lchown32", "lgetxattr",
    "link", "linkat", "listen", "listmount", "listxattr", "listxattrat", "llistxattr",
    "_llseek", "lremovexattr", "lseek", "lsetxattr", "lstat", "lstat64", "madvise",
    "map_shadow_stack", "membarrier", "memfd_create", "memfd_secret", "mincore", "mkdir",
    "mkdirat", "mknod", "mknodat", "mlock", "mlock2", "mlockall", "mmap", "mmap2", "mprotect",
    "mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive", "mq_timedreceive_time64",
    "mq_timedsend", "mq_timedsend_time64", "mq_unlink", "mremap", "mseal", "msgctl", "msgget",
    "msgrcv", "msgsnd", "msync", "munlock", "munlockall", "munmap", "name_to_handle_at",
    "nanosleep", "newfstatat", "_newselect", "open", "openat", "openat2", "pause",
    "pidfd_open", "pidfd_send_signal", "pipe", "pipe2", "pkey_alloc", "pkey_free",
    "pkey_mprotect", "poll", "ppoll", "ppoll_time64", "prctl", "pread64", "preadv", "preadv2",
    "prlimit64", "process_mrelease", "pselect6", "pselect6_time64", "pwrite64", "pwritev",
    "pwritev2", "read", "readahead", "readlink", "readlinkat", "readv", "recv", "recvfrom",
    "recvmmsg", "recvmmsg_time64", "recvmsg", "remap_file_pages", "removexattr",
    "removexattrat", "rename", "renameat", "renameat2", "restart_syscall", "riscv_hwprobe",
    "rmdir", "rseq", "rt_sigaction", "rt_sigpending", "rt_sigprocmask", "rt_sigqueueinfo",
    "rt_sigreturn", "rt_sigsuspend", "rt_sigtimedwait", "rt_sigtimedwait_time64",
    "rt_tgsigqueueinfo", "sched_getaffinity", "sched_getattr", "sched_getparam",
    "sched_get_priority_max", "sched_get_priority_min", "sched_getscheduler",
    "sched_rr_get_interval", "sched_rr_get_interval_time64", "sched_setaffinity",
    "sched_setattr", "sched_setparam", "sched_setscheduler", "sched_yield", "seccomp",
    "select", "semctl", "semget", "semop", "semtimedop", "semtimedop_time64", "send",
    "sendfile", "sendfile64", "sendmmsg", "sendmsg", "sendto", "setfsgid", "setfsgid32",
    "setfsuid", "setfsuid32", "setgid", "setgid32", "setgroups", "setgroups32", "setitimer",
    "setpgid", "setpriority", "setregid", "setregid32", "setresgid", "setresgid32",
    "setresuid", "setresuid32", "setreuid", "setreuid32", "setrlimit", "set_robust_list",
    "setsid", "setsockopt", "set_thread_area", "set_tid_address", "setuid", "setuid32",
    "setxattr", "setxattrat", "shmat", "shmctl", "shmdt", "shmget", "shutdown", "sigaltstack",
    "signalfd", "signalfd4", "sigprocmask", "sigreturn", "socketcall", "socketpair", "splice",
    "stat", "stat64", "statfs", "statfs64", "statmount", "statx", "symlink", "symlinkat",
    "sync", "sync_file_range", "syncfs", "sysinfo", "tee", "tgkill", "time", "timer_create",
    "timer_delete", "timer_getoverrun", "timer_gettime", "timer_gettime64", "timer_settime",
    "timer_settime64", "timerfd_create", "timerfd_gettime", "timerfd_gettime64",
    "timerfd_settime", "timerfd_settime64", "times", "tkill", "truncate", "truncate64",
    "ugetrlimit", "umask", "uname", "unlink", "unlinkat", "uretprobe", "utime", "utimensat",
    "utimensat_time64", "utimes", "vfork", "vmsplice", "wait4", "waitid", "waitpid", "write",
    "writev",
)


def _caps(*names: str) -> When:
    return When(caps=frozenset(names))


def _arches(*names: str) -> When:
    return When(arches=frozenset(names))


def _socket_family(op: str, family: int) -> Rule:
    return Rule(("socket",), args=(Arg(0, family, op),))


def _personality(persona: int) -> Rule:
    return Rule(("personality",), args=(Arg(0, persona, "SCMP_CMP_EQ"),))


RULES: tuple[Rule, ...] = (
    Rule(ALLOWED_TO_ALL),
    Rule(("process_vm_readv", "process_vm_writev", "ptrace"), includes=When(min_kernel=(4, 8))),
    # Every address family but AF_ALG and AF_VSOCK (38 and 40, one apart).
    _socket_family("SCMP_CMP_LT", AF_ALG),
    _socket_family("SCMP_CMP_EQ", AF_ALG + 1),
    _socket_family("SCMP_CMP_GT", AF_VSOCK),
    _personality(PER_LINUX),
    _personality(PER_LINUX32),
    _personality(UNAME26),
    _personality(UNAME26 | PER_LINUX32),
    _personality(PERSONALITY_QUERY),
    Rule(("sync_file_range2", "swapcontext"), includes=_arches("ppc64le")),
    Rule(
        (
            "arm_fadvise64_64", "arm_sync_file_range", "sync_file_range2", "breakpoint",
            "cacheflush", "set_tls",
        ),
        includes=_arches("arm", "arm64"),
    ),
    Rule(("arch_prctl",), includes=_arches("amd64", "x32")),
    Rule(("modify_ldt",), includes=_arches("amd64", "x32", "x86")),
    Rule(
        ("s390_pci_mmio_read", "s390_pci_mmio_write", "s390_runtime_instr"),
        includes=_arches("s390", "s390x"),
    ),
    Rule(("riscv_flush_icache",), includes=_arches("riscv64")),
    Rule(("open_by_handle_at",), includes=_caps("CAP_DAC_READ_SEARCH")),
    Rule(
        (
            "bpf", "clone", "clone3", "fanotify_init", "fsconfig", "fsmount", "fsopen",
            "fspick", "lookup_dcookie", "lsm_get_self_attr", "lsm_list_modules",
            "lsm_set_self_attr", "mount", "mount_setattr", "move_mount", "open_tree",
            "perf_event_open", "quotactl", "quotactl_fd", "setdomainname", "sethostname",
            "setns", "syslog", "umount", "umount2", "unshare",
        ),
        includes=_caps("CAP_SYS_ADMIN"),
    ),
    Rule(
        ("clone",),
        args=(Arg(0, CLONE_NAMESPACE_FLAGS, "SCMP_CMP_MASKED_EQ"),),
        excludes=When(caps=frozenset({"CAP_SYS_ADMIN"}), arches=frozenset({"s390", "s390x"})),
    ),
    # s390 passes clone's flags second.
    Rule(
        ("clone",),
        args=(Arg(1, CLONE_NAMESPACE_FLAGS, "SCMP_CMP_MASKED_EQ"),),
        includes=_arches("s390", "s390x"),
        excludes=_caps("CAP_SYS_ADMIN"),
    ),
    # clone3 passes its flags in memory, out of seccomp's sight: ENOSYS sends
    # libc back to clone(2), whose flags the rules above can check.
    Rule(("clone3",), action=ERRNO, errno_ret=ENOSYS, excludes=_caps("CAP_SYS_ADMIN")),
    Rule(("reboot",), includes=_caps("CAP_SYS_BOOT")),
    Rule(("chroot",), includes=_caps("CAP_SYS_CHROOT")),
    Rule(("delete_module", "init_module", "finit_module"), includes=_caps("CAP_SYS_MODULE")),
    Rule(("acct",), includes=_caps("CAP_SYS_PACCT")),
    Rule(
        (
            "kcmp", "pidfd_getfd", "process_madvise", "process_vm_readv",
            "process_vm_writev", "ptrace",
        ),
        includes=_caps("CAP_SYS_PTRACE"),
    ),
    Rule(("iopl", "ioperm"), includes=_caps("CAP_SYS_RAWIO")),
    Rule(
        ("settimeofday", "stime", "clock_settime", "clock_settime64"),
        includes=_caps("CAP_SYS_TIME"),
    ),
    Rule(("vhangup",), includes=_caps("CAP_SYS_TTY_CONFIG")),
    Rule(
        ("get_mempolicy", "mbind", "set_mempolicy", "set_mempolicy_home_node"),
        includes=_caps("CAP_SYS_NICE"),
    ),
    Rule(("syslog",), includes=_caps("CAP_SYSLOG")),
    Rule(("bpf",), includes=_caps("CAP_BPF")),
    Rule(("perf_event_open",), includes=_caps("CAP_PERFMON")),
)
