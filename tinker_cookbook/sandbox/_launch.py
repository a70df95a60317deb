"""The sandbox's launcher: trusted code that confines its own process, then starts the untrusted program.

Run by ``tinker_cookbook.sandbox.runner`` as ``python -I -S -B _launch.py '<json plan>'`` in a new session, with
the throwaway directory as its working directory. Standard library only (``-S``: no site-packages), so it starts
fast. In order:

1. join the run's pids cgroup (when the runner made one), so every process the program forks is counted and
   ``pids.max`` stops a fork bomb;
2. set the resource limits (inherited by everything started from here);
3. ask to be killed when the runner dies;
4. ``bwrap`` plan: exec bubblewrap, which does the rest (namespaces, read-only filesystem, no capabilities);
   ``plain`` plan: unshare a new PID and network namespace where the kernel allows it (a user namespace too when not
   root), then fork an init process (PID 1 of the new namespace) that restricts writes to the working directory
   with Landlock and forks the program. When PID 1 exits the kernel kills every process left in the namespace,
   including ones that left the process group with ``setsid``.

Exit status: the program's own, or 128 + N when signal N killed it (the convention bubblewrap uses too).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import struct
import sys

CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
# Landlock system calls (the same numbers on every architecture that has them) and flags.
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
# Filesystem rights (bit numbers of LANDLOCK_ACCESS_FS_*): write a file, remove a directory or file, make a
# char device, directory, regular file, socket, fifo, block device or symlink (ABI 1), rename/link across
# directories (ABI 2), truncate (ABI 3). Reads and execution are not handled, so they stay allowed.
WRITE_FILE, TRUNCATE = 1 << 1, 1 << 14
WRITE_RIGHTS_ABI1 = WRITE_FILE | sum(1 << bit for bit in range(4, 13))
WRITE_RIGHTS_BY_ABI = {1: WRITE_RIGHTS_ABI1, 2: WRITE_RIGHTS_ABI1 | 1 << 13, 3: WRITE_RIGHTS_ABI1 | 1 << 13 | TRUNCATE}
NET_BIND_TCP, NET_CONNECT_TCP = 1, 2
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2

libc = ctypes.CDLL(None, use_errno=True)


def join_cgroup(path: str) -> None:
    with open(os.path.join(path, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))


def set_limits(limits: dict[str, list[int]]) -> None:
    for name, (soft, hard) in limits.items():
        resource.setrlimit(getattr(resource, name), (soft, hard))


def die_with_parent() -> None:
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def unshare_namespaces() -> list[str]:
    """New PID and network namespaces (in a new user namespace when that is what it takes); what was made."""
    if libc.unshare(CLONE_NEWPID | CLONE_NEWNET) == 0:
        return ["pid", "net"]
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET) != 0:
        return []
    # Map our own ids so files written in the working directory keep their owner.
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    return ["user", "pid", "net"]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 or less where there is none."""
    return int(libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION))


def landlock(workdir: str) -> bool:
    """Forbid every write outside ``workdir`` (and TCP, and signals to processes outside); False where the kernel
    has no Landlock."""
    abi = landlock_abi()
    if abi < 1:
        return False
    fs = WRITE_RIGHTS_BY_ABI[min(abi, 3)]
    if abi >= 6:
        attr = struct.pack("QQQ", fs, NET_BIND_TCP | NET_CONNECT_TCP, SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL)
    elif abi >= 4:
        attr = struct.pack("QQ", fs, NET_BIND_TCP | NET_CONNECT_TCP)
    else:
        attr = struct.pack("Q", fs)
    ruleset = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.c_char_p(attr), len(attr), 0)
    if ruleset < 0:
        return False
    try:
        for path, rights in ((workdir, fs), ("/dev/null", WRITE_FILE | (TRUNCATE if abi >= 3 else 0))):
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = struct.pack("=Qi", rights, fd)
                if libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, ctypes.c_char_p(rule), 0):
                    return False
            finally:
                os.close(fd)
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        return libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) == 0
    finally:
        os.close(ruleset)


def exit_code(status: int) -> int:
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def wait_for(pid: int) -> int:
    """The exit code of child ``pid``; other children (orphans re-parented to an init) are reaped on the way."""
    while True:
        reaped, status = os.wait()
        if reaped == pid:
            return exit_code(status)


def run_init(argv: list[str], workdir: str, require_landlock: bool) -> None:
    """PID 1 of the new namespace (or a plain child): confine, fork the program, report its exit code."""
    die_with_parent()
    if not landlock(workdir) and require_landlock:
        os.write(2, b"sandbox: Landlock is not available, refusing to run without write protection\n")
        os._exit(126)
    pid = os.fork()
    if pid == 0:
        os.execv(argv[0], argv)
    os._exit(wait_for(pid))


def probe() -> None:
    """Print what this machine allows (run in a throwaway process: unsharing changes the caller)."""
    print(json.dumps({"namespaces": unshare_namespaces(), "landlock_abi": max(landlock_abi(), 0)}))


def main() -> None:
    if sys.argv[1] == "--probe":
        probe()
        return
    plan = json.loads(sys.argv[1])
    if plan["cgroup"]:
        join_cgroup(plan["cgroup"])
    set_limits(plan["rlimits"])
    die_with_parent()
    argv: list[str] = plan["argv"]
    if plan["mode"] == "bwrap":
        os.execv(argv[0], argv)
    namespaces = unshare_namespaces() if plan["namespaces"] else []
    if plan["namespaces"] and not namespaces and plan["require_namespaces"]:
        os.write(2, b"sandbox: cannot create PID and network namespaces here\n")
        os._exit(126)
    pid = os.fork()
    if pid == 0:
        run_init(argv, os.getcwd(), plan["require_landlock"])
    os._exit(wait_for(pid))


if __name__ == "__main__":
    main()
