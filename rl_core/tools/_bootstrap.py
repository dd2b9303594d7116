"""The first code of every sandboxed process (`rl_core.tools.sandbox`), run as `python -I -c`.

It reads its settings from argv[1] (JSON), then, in this order: leaves the network (a fresh
network namespace where the kernel permits one), lowers its resource limits, installs an audit
hook that refuses blocked operations (it cannot be removed), and runs `main.py` of the working
folder as `__main__`. A refused operation raises PermissionError in the program and writes one
note to the parent's note pipe. A MemoryError ends the process with exit status MEMORY_EXIT.
Only the standard library; nothing of rl_core is imported (the parent passes this file's text).
"""

import json
import os
import resource
import sys

settings = json.loads(sys.argv[1])


def _leave_network():
    """A fresh network namespace (no interfaces but a downed loopback): as root directly,
    otherwise inside a new user namespace where those are enabled; silently nothing elsewhere."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        for flags in (0x40000000, 0x40000000 | 0x10000000):  # CLONE_NEWNET, + CLONE_NEWUSER
            if libc.unshare(flags) == 0:
                return
    except Exception:  # noqa: BLE001 - the audit hook still refuses sockets
        pass


def _limit(name, soft, hard=None):
    which = getattr(resource, name, None)
    if which is None:
        return
    try:
        resource.setrlimit(which, (soft, soft if hard is None else hard))
    except (ValueError, OSError):
        pass


_leave_network()
import subprocess  # noqa: E402,F401 - loaded now so that its fork_exec can be replaced below
import _posixsubprocess  # noqa: E402

_cpu = int(settings["cpu_time_s"]) + (settings["cpu_time_s"] % 1 > 0)
_limit("RLIMIT_CPU", max(1, _cpu), max(1, _cpu) + 1)
_limit("RLIMIT_AS", settings["memory_bytes"])
_limit("RLIMIT_FSIZE", settings["file_bytes"])
_limit("RLIMIT_CORE", 0)
_limit("RLIMIT_NOFILE", 64)
if os.geteuid() != 0:  # root is exempt from RLIMIT_NPROC: the audit hook refuses forks there
    _limit("RLIMIT_NPROC", 1)


def _refused(*args, **kwargs):
    raise PermissionError("sandbox: starting processes is not allowed")


_posixsubprocess.fork_exec = _refused

HOOK = '''
def hook(event, args):
    if event in BLOCKED or event[:7] == "ctypes.":
        refuse(event, "")
    elif event in PATHS:
        for index in PATHS[event]:
            if index < len(args) and not inside(args[index]):
                refuse(event, args[index])
    elif event == "open":
        path, mode, flags = args
        writes = flags & WRITE_FLAGS or (mode is not None and set(str(mode)) & WRITE_MODES)
        if writes and not inside(path):
            refuse("open for writing", path)
        if mode is None and not isinstance(path, int) and not inside(path) and isdir(path):
            refuse("opening a folder", path)
    elif event == "object.__setattr__" and args[1] == "__code__":
        refuse("replacing a function's code", "")
    elif event == "import" and args[0] == "_posixsubprocess":
        refuse("loading _posixsubprocess again", "")


def inside(path):
    if isinstance(path, int):
        return path >= 0
    try:
        path = fsdecode(path)
    except Exception:
        return False
    if path in ALLOWED:
        return True
    if not path.startswith("/"):
        path = getcwd() + "/" + path
    parts = []
    for part in path.split("/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part and part != ".":
            parts.append(part)
    return ("/" + "/".join(parts) + "/").startswith(FOLDER + "/")


def isdir(path):
    try:
        return S_ISDIR(stat(path).st_mode)
    except Exception:
        return False


def refuse(what, path):
    if not noted:
        noted.append(1)
        try:
            write(NOTES, (what + " " + repr(path))[:300].encode() + b"\\n")
        except Exception:
            pass
    shown = what + (" " + repr(path) if path != "" else "")
    raise PermissionError("sandbox: " + shown + " is not allowed")
'''


def _install_hook():
    import builtins
    import posix
    import stat

    namespace = {
        "__builtins__": dict(vars(builtins)),
        "BLOCKED": frozenset(settings["blocked"]),
        "PATHS": {event: tuple(at) for event, at in settings["path_events"].items()},
        "WRITE_FLAGS": os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND,
        "WRITE_MODES": frozenset("wax+"),
        "ALLOWED": frozenset({"/dev/null"}),
        "FOLDER": settings["folder"].rstrip("/"),
        "fsdecode": os.fsdecode,
        "getcwd": posix.getcwd,
        "stat": posix.stat,
        "S_ISDIR": stat.S_ISDIR,
        "write": posix.write,
        "NOTES": settings["notes_fd"],
        "noted": [],
    }
    exec(HOOK, namespace)  # a namespace of its own: the program cannot reach the hook's names
    sys.addaudithook(namespace["hook"])


def _run():
    import types

    with open("main.py", encoding="utf-8") as file:
        source = file.read()
    main = types.ModuleType("__main__")
    main.__file__ = "main.py"
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    sys.argv = ["main.py"]
    _install_hook()
    try:
        exec(compile(source, "main.py", "exec"), vars(main))
    except MemoryError:
        _flush()
        try:
            sys.stderr.write("MemoryError: the program used more memory than its limit\n")
            sys.stderr.flush()
        finally:
            os._exit(settings["memory_exit"])
    except SystemExit:
        raise
    except BaseException as error:  # print the program's own frames only
        import traceback

        _flush()
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != "main.py":
            tb = tb.tb_next
        traceback.print_exception(type(error), error, tb)
        _flush()
        os._exit(1)


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or broken stream
            pass


try:
    _run()
except MemoryError:
    os._exit(settings["memory_exit"])
