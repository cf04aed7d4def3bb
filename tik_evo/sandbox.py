"""The candidate runner's sandbox (Linux): what a candidate's process may touch, and killing all it started.

Applied in the runner after fork and before the candidate is imported; each protection is tried and recorded, so
an audit's evidence says what was enforced on that machine (`Enforced`). With ``mode="strict"`` a protection
that cannot be had fails the audit instead.

- network: a new network namespace (no interface but a down loopback);
- files: a new mount namespace where every mount is read-only except the private directory, the source's own
  Triton cache, /dev, /proc, /sys; the run directory and $HOME are hidden under empty tmpfs (all but what Python
  itself needs there);
- privileges: every capability dropped (so the mounts cannot be undone) and no_new_privs set. The runner stays
  dumpable: the judge opens the CUDA memory it exports, which may take ptrace-level access to it (the judge, with
  its capabilities, has that; the runner, without any, has none to the judge or the engine);
- resources: rlimits on file size, core dumps, open files (and address space on the CPU: CUDA reserves more
  virtual memory than any limit would allow);
- processes: the judge is a child subreaper, so whatever a runner leaves behind (a daemon, a double fork)
  becomes the judge's child and `kill_descendants` ends it with the runner. PID namespaces are not used: CUDA IPC
  handles cannot cross them.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND = 0x1, 0x2, 0x4, 0x20, 0x1000
MS_REC, MS_PRIVATE = 0x4000, 0x40000
PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 4, 24, 38, 36
# Mount points a CUDA process needs writable or that are not files (device nodes, kernel interfaces).
KEEP_WRITABLE = ("/dev", "/proc", "/sys")
FILE_LIMIT = 4 << 30  # largest file a candidate may write (its Triton cache, compiler temporaries)
CPU_AS_LIMIT = 32 << 30

# Variables a runner keeps from its parent's environment; everything else (API keys, tokens, paths) is dropped.
ENV_KEEP = ("PATH", "LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "LD_LIBRARY_PATH", "TRITON_INTERPRET",
            "TRITON_PTXAS_PATH", "TRITON_CUOBJDUMP_PATH", "TRITON_NVDISASM_PATH", "TRITON_LIBCUDA_PATH",
            "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "OMP_NUM_THREADS", "PYTHONPATH")


class SandboxError(RuntimeError):
    """A protection that mode "strict" requires could not be applied."""


@dataclass
class Enforced:
    """What the sandbox applied; `missing` names each protection it could not have, with the reason."""

    mode: str = "auto"
    network: bool = False
    readonly_files: bool = False
    hidden: list[str] = field(default_factory=list)
    capabilities_dropped: bool = False
    no_new_privs: bool = False
    rlimits: dict[str, int] = field(default_factory=dict)
    env_scrubbed: bool = False
    private_dir: str = ""
    missing: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def prctl(option: int, arg: int = 0) -> None:
    _check(_libc().prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


def become_subreaper() -> bool:
    """Orphans of this process's descendants become its children (so `kill_tree` reaches them)."""
    try:
        prctl(PR_SET_CHILD_SUBREAPER, 1)
        return True
    except (OSError, AttributeError):
        return False


def scrubbed_env(env: dict[str, str], private: Path, cache: str | None = None, cache_read: list[str] = ()
                 ) -> dict[str, str]:
    """The runner's environment: a few kept variables, every home and cache in the private dir, except Triton's
    compile cache when ``cache`` is given (see tik_evo.kernel_cache)."""
    out = {k: v for k, v in env.items() if k in ENV_KEEP}
    out.update(HOME=str(private), TMPDIR=str(private), PYTHONDONTWRITEBYTECODE="1",
               CUDA_CACHE_PATH=str(private / "nv"), TRITON_CACHE_DIR=cache or str(private / "triton"),
               TRITON_HOME=str(private), XDG_CACHE_HOME=str(private / "cache"))
    if cache:
        out.update(TRITON_CACHE_MANAGER="tik_evo.kernel_cache:LineageCache",
                   TIK_EVO_CACHE_READ=os.pathsep.join(cache_read))
    return out


def _mounts() -> list[str]:
    """Mount points, parents before children (the order of /proc/self/mountinfo)."""
    points = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            mp = line.split()[4].encode().decode("unicode_escape")
            points.append(mp)
    return points


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    libc = _libc()
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    _check(libc.mount(src.encode() if src else None, target.encode(), fstype.encode() if fstype else None,
                      flags, data.encode() if data else None), f"mount {target}")


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _readonly_filesystem(private: Path, writable_dirs: list[str], visible: list[str], hide: list[str],
                         out: Enforced) -> None:
    """Every mount read-only except the private dir and ``writable_dirs``; ``hide`` covered by empty tmpfs except
    what the runner needs in them (``visible``, Python's own paths). Needs a new mount namespace, made here."""
    _check(_libc().unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    for mp in _mounts():
        if _under(mp, KEEP_WRITABLE):
            continue
        # MS_BIND with MS_REMOUNT: this mount's flags only, never the filesystem's (other namespaces keep rw).
        with contextlib.suppress(OSError):  # some kernel mounts refuse a remount; the rest still counts
            _mount(None, mp, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    # Then the writable places, each a bind mount of its own made writable again (a bind copies its source's
    # read-only flag). Done after the pass above, so no path spelling in mountinfo (a symlinked /tmp) matters.
    for d in (str(private), *writable_dirs):
        _mount(d, d, None, MS_BIND)
        _mount(None, d, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV)
    needed = tuple(str(Path(p).resolve()) for p in (*sys.path, sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                     str(private), *writable_dirs, *visible) if p and Path(p).exists())
    for path in hide:
        _hide(Path(path).resolve(), needed, out, depth=3)
    for d in (str(private), *writable_dirs):  # what must stay writable, is
        probe_file = Path(d) / ".tik_evo_write_probe"
        probe_file.write_text("")
        probe_file.unlink()
    probe = Path(__file__)
    try:
        with open(probe, "a"):
            pass
        raise OSError(0, f"{probe} still writable after the remount")
    except PermissionError:
        pass  # a file this process owns, refused: read-only indeed
    except OSError as e:
        if e.errno not in (30,):  # EROFS
            raise
    out.readonly_files = True


def _hide(path: Path, needed: tuple[str, ...], out: Enforced, depth: int) -> None:
    """Cover ``path`` with an empty read-only tmpfs (a file: with /dev/null), unless the runner needs something
    inside it (Python installed under $HOME, say): then hide each of its entries that it does not need."""
    inside = [n for n in needed if _under(n, (str(path),))]
    try:
        if not inside:
            if path.is_dir():
                _mount("tmpfs", str(path), "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k")
            elif path.exists():  # a file or a device node (a warm runner's GPU)
                _mount("/dev/null", str(path), None, MS_BIND)
            else:
                return
            out.hidden.append(str(path))
        elif depth > 0 and path.is_dir() and str(path) not in needed:
            for child in sorted(path.iterdir()):
                if not child.is_symlink():
                    _hide(child, needed, out, depth - 1)
    except OSError as e:
        out.missing[f"hide {path}"] = str(e)


def _drop_capabilities() -> None:
    for cap in range(64):
        try:
            prctl(PR_CAPBSET_DROP, cap)
        except OSError as e:
            if e.errno == 22:  # EINVAL: past the last capability this kernel knows
                break
            raise

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    header = Header(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3: two Data words
    data = (Data * 2)()
    _check(_libc().capset(ctypes.byref(header), ctypes.byref(data)), "capset")


def enter(private: Path, mode: str, device: str, hide: list[str], writable: list[str] = (),
          visible: list[str] = ()) -> Enforced:
    """Confine this process (the runner, before it imports a candidate). ``mode``: "auto" applies what it can,
    "strict" raises SandboxError for anything missing, "off" applies only the private directory and env."""
    out = Enforced(mode=mode, private_dir=str(private), env_scrubbed=True)
    if mode == "off":
        return out
    steps = [
        ("network", lambda: _check(_libc().unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")),
        ("readonly_files", lambda: _readonly_filesystem(private, list(writable), list(visible), hide, out)),
        ("rlimits", lambda: _rlimits(out, device)),
        ("capabilities_dropped", _drop_capabilities),
        ("no_new_privs", lambda: prctl(PR_SET_NO_NEW_PRIVS, 1)),
    ]
    for name, step in steps:
        try:
            step()
            if name != "rlimits":
                setattr(out, name, True)
        except (OSError, AttributeError) as e:
            out.missing[name] = str(e)
    if mode == "strict" and out.missing:
        raise SandboxError(f"sandbox (evaluate.sandbox=strict) could not apply: {out.missing}")
    return out


def _rlimits(out: Enforced, device: str) -> None:
    limits = {"RLIMIT_FSIZE": FILE_LIMIT, "RLIMIT_CORE": 0, "RLIMIT_NOFILE": 4096}
    if device == "cpu":
        limits["RLIMIT_AS"] = CPU_AS_LIMIT
    for name, value in limits.items():
        which = getattr(resource, name)
        soft, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))
        out.rlimits[name] = value


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    return children


def descendants(pid: int, keep: frozenset[int] = frozenset()) -> list[int]:
    """Every live process below ``pid``, read from /proc, leaving out the subtrees of the pids in ``keep``."""
    children = _children()
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in keep:
                out.append(c)
                todo.append(c)
    return out


def _reap() -> None:
    while True:  # our zombies: children, and orphans handed to us as subreaper
        try:
            done, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not done:
            return


def kill_descendants(keep: frozenset[int] = frozenset(), wait_s: float = 5.0) -> int:
    """SIGKILL every descendant of this process except the subtrees of ``keep`` (a runner still needed), and reap
    them; returns how many were killed. With this process a subreaper, that includes whatever a killed runner
    left running (a daemon, a double fork)."""
    killed = 0
    deadline = time.time() + wait_s
    while True:
        live = []
        for p in descendants(os.getpid(), keep):
            try:
                os.kill(p, signal.SIGKILL)
                live.append(p)
            except ProcessLookupError:
                pass
        killed += len(live)
        _reap()
        if not live or time.time() > deadline:
            return killed
        time.sleep(0.01)
