"""Running model-written Python in a separate, limited process.

    from rl_core.tools.sandbox import SandboxLimits, run_python

    result = run_python("print(sum(range(10)))", SandboxLimits(wall_time_s=5))
    result.status, result.stdout      # ("ok", "45\\n")
    run_python("while True: pass").status                      # "timeout"
    run_python("import socket; socket.create_connection(('example.com', 80))").status  # "refused"

Each call starts `python -I` (the interpreter running this code, its packages importable) in a
new session, in a throwaway working folder that is removed afterwards, with an environment of
only PATH, LANG, HOME and TMPDIR (the folder). In the child, before the program runs:

- the network is left: a fresh network namespace (as root, or in a new user namespace where the
  kernel allows one; silently skipped where neither is permitted);
- resource limits: CPU time (`cpu_time_s`), address space (`memory_mb`; a MemoryError ends the
  run as "memory"), file size (FILE_BYTES), open files, no core files, and RLIMIT_NPROC 1 for a
  user other than root (root is exempt from it);
- an audit hook (`sys.addaudithook`, which cannot be removed) refuses: creating or connecting
  sockets and name look-ups; starting processes (fork, exec, spawn, system, subprocess); sending
  signals; ctypes; raising resource limits; the garbage collector's object lists; opening for
  writing, creating, removing, renaming or changing anything outside the working folder
  (/dev/null aside); links; opening folders outside it. A refused operation raises
  PermissionError in the program, and the run's status is "refused".

The parent reads stdout and stderr as they come, at most `output_bytes` of each; a program that
writes more is killed ("output"). A program still running at `wall_time_s` is killed with its
whole process group ("timeout", as is one killed by its CPU-time limit). No process of a call
outlives it. Calls are independent: any number of threads may call `run_python` at once.

What this does not guarantee: the audit hook runs inside the program's own interpreter, so it
stops programs that try blocked operations by ordinary means, not code crafted to corrupt the
interpreter's state from within; the kernel limits (CPU, memory, file size, the network
namespace, the process group kill) hold regardless. Reading files is not restricted beyond the
permissions of the user the run has. Disk use is bounded per file (FILE_BYTES), not in total,
until the folder is removed. For code from untrusted parties run the whole rollout in a
container or VM as well.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from rl_core.errors import InputError

OK, ERROR, TIMEOUT, MEMORY, OUTPUT, REFUSED = (
    "ok", "error", "timeout", "memory", "output", "refused")
STATUSES = (OK, ERROR, TIMEOUT, MEMORY, OUTPUT, REFUSED)
FILE_BYTES = 64 * 2**20  # largest file a program may write (RLIMIT_FSIZE)
MEMORY_EXIT = 86  # the exit status of a program ended by a MemoryError
READ_CHUNK = 65536

# Audit events refused outright, and events whose arguments at these positions are paths that
# must lie inside the working folder.
BLOCKED_EVENTS = (
    "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
    "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr",
    "socket.gethostbyname_ex", "socket.getnameinfo", "socket.sethostname",
    "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
    "os.startfile", "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg",
    "os.symlink", "os.link", "resource.setrlimit", "resource.prlimit",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents",
    "syslog.openlog", "syslog.syslog", "webbrowser.open",
)
PATH_EVENTS = {
    "os.remove": (0,), "os.rmdir": (0,), "os.rename": (0, 1), "os.mkdir": (0,),
    "os.chmod": (0,), "os.chown": (0,), "os.truncate": (0,), "os.utime": (0,),
    "os.chdir": (0,), "os.mkfifo": (0,), "os.mknod": (0,), "os.setxattr": (0,),
    "os.removexattr": (0,), "os.chflags": (0,), "shutil.rmtree": (0,),
    "shutil.copyfile": (1,), "shutil.copytree": (1,), "shutil.move": (0, 1),
    "shutil.chown": (0,), "sqlite3.connect": (0,), "dbm.open": (0,),
}


@dataclass(frozen=True)
class SandboxLimits:
    """What one run may use: CPU seconds, address space in MiB, wall-clock seconds, and bytes
    of stdout and of stderr each."""

    cpu_time_s: float = 5.0
    memory_mb: int = 512
    wall_time_s: float = 10.0
    output_bytes: int = 4096

    def __post_init__(self) -> None:
        for name, low in (("cpu_time_s", 0.01), ("memory_mb", 32), ("wall_time_s", 0.01),
                          ("output_bytes", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < low:
                raise InputError(f"sandbox limit {name}: {value!r} is not a number of at least "
                                 f"{low}: give a larger value")


@dataclass(frozen=True)
class SandboxResult:
    """How a run ended. status: "ok" (exit 0), "error" (non-zero exit, an exception),
    "timeout" (CPU or wall time), "memory", "output" (stdout or stderr beyond the limit, cut)
    or "refused" (a blocked operation was tried). stderr ends with a "[sandbox] ..." line
    saying why the run was stopped, when it was. exit_code: None when the process was killed
    by a signal."""

    status: str
    stdout: str
    stderr: str
    exit_code: int | None
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status == OK


def run_python(code: str, limits: SandboxLimits = SandboxLimits(),
               stdin: str = "") -> SandboxResult:
    """Run `code` as the main program of a fresh sandboxed Python process with `stdin` as its
    standard input; see the module's docstring for what it may do."""
    if not isinstance(code, str):
        raise InputError(f"code must be text, got {type(code).__name__}")
    started = time.monotonic()
    folder = tempfile.mkdtemp(prefix="ascent-sandbox-")
    notes_read, notes_write = os.pipe()
    try:
        Path(folder, "main.py").write_text(code, encoding="utf-8", errors="surrogateescape")
        with tempfile.TemporaryFile() as stdin_file:
            stdin_file.write(stdin.encode("utf-8", "surrogateescape"))
            stdin_file.seek(0)
            settings = _settings(folder, limits, notes_write)
            process = subprocess.Popen(
                [sys.executable, "-I", "-c", _bootstrap(), json.dumps(settings)],
                stdin=stdin_file, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=folder,
                env=_environment(folder), start_new_session=True, pass_fds=(notes_write,))
        os.close(notes_write)
        notes_write = -1
        try:
            return _watch(process, notes_read, limits, started)
        finally:
            _end(process)
    finally:
        for fd in (notes_read, notes_write):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)


def _settings(folder: str, limits: SandboxLimits, notes_fd: int) -> dict:
    return {
        "folder": os.path.realpath(folder), "notes_fd": notes_fd,
        "cpu_time_s": float(limits.cpu_time_s), "memory_bytes": int(limits.memory_mb) * 2**20,
        "file_bytes": FILE_BYTES, "memory_exit": MEMORY_EXIT,
        "blocked": list(BLOCKED_EVENTS), "path_events": PATH_EVENTS,
    }


def _environment(folder: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": folder,
            "TMPDIR": folder, "PYTHONIOENCODING": "utf-8", "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@cache
def _bootstrap() -> str:
    return Path(__file__).with_name("_bootstrap.py").read_text(encoding="utf-8")


def _watch(process: subprocess.Popen, notes_fd: int, limits: SandboxLimits,
           started: float) -> SandboxResult:
    """Read the process's output until it ends, is killed for its output, or its wall time runs
    out; then the result."""
    assert process.stdout is not None and process.stderr is not None
    cap = int(limits.output_bytes)
    streams = {process.stdout.fileno(): bytearray(), process.stderr.fileno(): bytearray()}
    notes = bytearray()
    stopped: str | None = None
    deadline = started + float(limits.wall_time_s)
    with selectors.DefaultSelector() as selector:
        for fd in (*streams, notes_fd):
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map() and stopped is None:
            left = deadline - time.monotonic()
            if left <= 0:
                stopped = TIMEOUT
                break
            for key, _ in selector.select(min(left, 1.0)):
                fd = key.fd
                try:
                    chunk = os.read(fd, READ_CHUNK)
                except BlockingIOError:
                    continue
                if not chunk:
                    selector.unregister(fd)
                    continue
                if fd == notes_fd:
                    notes += chunk[: max(0, 1024 - len(notes))]
                    continue
                streams[fd] += chunk
                if len(streams[fd]) > cap:
                    stopped = OUTPUT
    while stopped is None and not _exited(process):  # the output ended: exiting soon
        if time.monotonic() >= deadline:
            stopped = TIMEOUT
        else:
            time.sleep(0.005)
    # Whatever is left of its group goes too: the group cannot have been reused while its
    # exited leader is not reaped yet.
    _kill_group(process)
    process.wait()
    out, err = (bytes(streams[s.fileno()][:cap]) for s in (process.stdout, process.stderr))
    status, note = _status(process.returncode, stopped, bool(notes), limits)
    stderr = err.decode("utf-8", "replace")
    if note:
        stderr = (stderr + ("\n" if stderr and not stderr.endswith("\n") else "")
                  + f"[sandbox] {note}\n")
    code = process.returncode if process.returncode >= 0 else None
    return SandboxResult(status, out.decode("utf-8", "replace"), stderr, code,
                         time.monotonic() - started)


def _status(returncode: int, stopped: str | None, refused: bool,
            limits: SandboxLimits) -> tuple[str, str]:
    """(status, the note saying why the run was stopped, or "")."""
    if stopped == TIMEOUT:
        return TIMEOUT, f"timed out after {limits.wall_time_s:g} s of wall time and was stopped"
    if stopped == OUTPUT:
        return OUTPUT, (f"wrote more than {limits.output_bytes} bytes of output and was "
                        "stopped; the output is cut there")
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return TIMEOUT, f"used more than {limits.cpu_time_s:g} s of CPU time and was stopped"
    if returncode == MEMORY_EXIT:
        return MEMORY, f"ran out of memory (limit {limits.memory_mb} MiB)"
    if returncode == -signal.SIGXFSZ:
        return OUTPUT, f"wrote a file larger than {FILE_BYTES // 2**20} MiB and was stopped"
    if refused:
        return REFUSED, "tried an operation the sandbox does not allow (see the error above)"
    if returncode < 0:
        return ERROR, f"killed by signal {signal.Signals(-returncode).name}"
    return (OK, "") if returncode == 0 else (ERROR, "")


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _exited(process: subprocess.Popen) -> bool:
    """Whether the process has ended, without reaping it."""
    try:
        return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _end(process: subprocess.Popen) -> None:
    """Kill the process's group unless it was reaped already, reap it, close its pipes."""
    if process.returncode is None:
        _kill_group(process)
        process.wait()
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()


__all__ = ["FILE_BYTES", "SandboxLimits", "SandboxResult", "STATUSES", "run_python"]
