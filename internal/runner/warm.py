# agentrun's warm launcher (internal/runner/warm.go). It is the program of a
# warm pooled sandbox, started under every restriction of the sandbox as
#
#     <the language's argv, with {file} replaced by:> LAUNCHER FD PRELOAD FILE
#
# and is agentrun's own file, mounted read-only: no image can change it. It
# imports the modules of PRELOAD (comma-separated) with its output sent to
# /dev/null, says "ready" (or "fail REASON") on the socket at descriptor
# FD, and waits. At the run's take agentrun has written the task's files
# and code into /workspace; it says "go", the launcher says "ok", waits for
# agentrun to close its end, closes its own, and runs FILE as __main__ the
# way `python3 FILE` runs it: the task's own code, argv, sys.path[0],
# traceback, exit status and atexit handlers. It imports nothing that the
# interpreter's own start does not: the task sees sys.modules as a cold
# run's, plus the preloaded modules. It reads a SystemExit, reports an
# uncaught exception and ends the interpreter as CPython's own C code does
# (_exit_status, _report, _exit), without the teardown of every module.
# One thing it cannot see: sys.exit(VALUE) hands the interpreter VALUE
# itself, which an except clause (this launcher's, or any the exception
# passes through in a cold run) gets as SystemExit(VALUE) made from it, so
# that sys.exit(()) and sys.exit((3,)) read as SystemExit() and
# SystemExit(3), and an exception with a code attribute as SystemExit(it).
# Values and figures are shown by agentrun's run launcher (run.py, mounted
# at VALUES), as in a cold run.
import os
import sys


def _line(fd):
    """One line from fd, without its newline; None at the end."""
    buf = b""
    while not buf.endswith(b"\n"):
        b = os.read(fd, 1)
        if not b or len(buf) > 1024:
            return None
        buf += b
    return buf[:-1]


def _prepare():
    fd, preload, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    os.set_inheritable(fd, False)  # not to what the preloads start
    # The preloads' own output goes nowhere: the run's output is its task's.
    saved = os.dup(1), os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    failure = None
    for name in filter(None, preload.split(",")):
        try:
            __import__(name)
        except BaseException as e:  # SystemExit and KeyboardInterrupt too
            failure = "preload %s: %s: %s" % (name, type(e).__name__, e)
            break
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    os.dup2(saved[0], 1)
    os.dup2(saved[1], 2)
    os.close(saved[0])
    os.close(saved[1])
    if failure is not None:
        os.write(fd, b"fail " + " ".join(failure.split()).encode("utf-8", "replace")[:900] + b"\n")
        os._exit(1)
    os.write(fd, b"ready\n")
    # The hand-over: "go", our "ok", then agentrun's close, before any of
    # the task's code runs. Anything else: no run.
    if _line(fd) != b"go":
        os._exit(0)
    os.write(fd, b"ok\n")
    if os.read(fd, 1) != b"":
        os._exit(1)
    os.close(fd)

    path = argv[0]
    sys.argv[:] = argv
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    orig = getattr(sys, "orig_argv", None)
    if orig is not None:
        i = orig.index(__file__) if __file__ in orig else -1
        if i >= 0:
            sys.orig_argv = orig[:i] + orig[i + 3:]
    own = sys.modules["__main__"]
    main = type(sys)("__main__")
    main.__loader__ = type(own.__loader__)("__main__", path)
    main.__annotations__ = {}
    main.__builtins__ = own.__builtins__
    main.__file__ = path
    main.__cached__ = None
    sys.modules["__main__"] = main
    with open(path, "rb") as f:
        source = f.read()
    return source, path, main.__dict__


VALUES = "/dev/agentrun-run.py"


def _values():
    """The run launcher's namespace (run.py), started: its program() makes
    the code's last expression show its value."""
    ns = {"__name__": "agentrun_run", "__file__": VALUES}
    with open(VALUES, "rb") as f:
        exec(compile(f.read(), VALUES, "exec"), ns)
    ns["start"]()
    return ns


def _own(tb):
    """tb without its first entries that are this launcher's frames: the
    interpreter reports an exception from the task's frames only."""
    while tb is not None and tb.tb_frame.f_globals is globals():
        tb = tb.tb_next
    return tb


def _write_stderr(text):
    """Writes text as the interpreter's PySys_WriteStderr does: to
    sys.stderr, or to descriptor 2 where there is none or it fails."""
    try:
        sys.stderr.write(text)
    except BaseException:
        try:
            os.write(2, text.encode("utf-8", "backslashreplace"))
        except OSError:
            pass


def _hook_args():
    """The type of sys.unraisablehook's argument, which Python names
    nowhere: that of one caught from a report made here; None if none
    came."""
    caught = []
    hook = sys.__dict__.get("unraisablehook", _MISSING)
    sys.unraisablehook = caught.append

    class Probe:
        def __del__(self):
            raise ValueError

    Probe()
    if hook is _MISSING:
        del sys.unraisablehook
    else:
        sys.unraisablehook = hook
    return type(caught[0]) if caught else None


def _call_unraisablehook(hook, args):
    """Calls hook (sys.unraisablehook, or None for the default) with args
    as the interpreter does: a hook that fails is reported through the
    default one, as "Exception ignored in sys.unraisablehook"."""
    if hook is None:
        hook = _default_unraisablehook
    failure = None
    try:
        hook(args)
    except BaseException as e:
        failure = e
    if failure is not None:
        tb = _own(failure.__traceback__)
        failure.__traceback__ = tb
        msg = "Exception ignored in sys.unraisablehook"
        try:
            _default_unraisablehook(type(args)((type(failure), failure, tb, msg, hook)))
        except BaseException:
            pass


def _unraisable(e, obj):
    """Reports e, raised by obj at the interpreter's end, as its
    PyErr_WriteUnraisable does: through sys.unraisablehook, without this
    launcher's frames."""
    args = _hook_args()
    if args is None:
        return
    tb = _own(e.__traceback__)
    e.__traceback__ = tb
    _call_unraisablehook(sys.__dict__.get("unraisablehook"), args((type(e), e, tb, None, obj)))


def _run_exitfuncs():
    """Runs the atexit handlers as the interpreter's end does, with no
    frame under them: the report of an exception that a handler in C
    raises names no frame of this launcher, where the interpreter would
    name the one that called them."""
    import atexit

    if not atexit._ncallbacks():
        return
    hook = sys.__dict__.get("unraisablehook", _MISSING)

    def report(args):
        tb = _own(args.exc_traceback)
        if args.exc_value is not None:
            args.exc_value.__traceback__ = tb
        args = type(args)((args.exc_type, args.exc_value, tb, args.err_msg, args.object))
        _call_unraisablehook(None if hook is _MISSING else hook, args)

    sys.unraisablehook = report
    try:
        atexit._run_exitfuncs()
    except BaseException:
        pass
    # A handler's own hook stays.
    if sys.__dict__.get("unraisablehook") is report:
        if hook is _MISSING:
            del sys.unraisablehook
        else:
            sys.unraisablehook = hook


def _flush_std():
    """Flushes sys.stdout and sys.stderr as the interpreter's end does
    (flush_std_files): one that is None, missing or closed is left alone;
    False if a flush failed, reported for stdout as unraisable."""
    ok = True
    for name in ("stdout", "stderr"):
        f = sys.__dict__.get(name)
        if f is None:
            continue
        try:
            closed = bool(f.closed)
        except BaseException:
            closed = False
        if closed:
            continue
        failure = None
        try:
            f.flush()
        except BaseException as e:
            failure = e
        if failure is not None:
            ok = False
            if name == "stdout":
                _unraisable(failure, f)
            del failure
    return ok


def _exit(status, interrupted=False):
    """Ends the interpreter as its own end does what a program can see
    (Py_FinalizeEx: non-daemon threads joined, atexit handlers run, output
    flushed, 120 if that fails; 130 after an uncaught KeyboardInterrupt),
    but without tearing every module down: the preloads' teardown (pandas')
    would cost the run tens of milliseconds of CPU after its code ended."""
    threading = _modules.get("threading")
    if threading is not None:
        failure = None
        try:
            threading._shutdown()
        except BaseException as e:
            failure = e
        if failure is not None:
            _unraisable(failure, threading)
            del failure
    _run_exitfuncs()
    ok = _flush_std()
    # The teardown puts the original streams back and flushes them again:
    # what the program wrote to them before it replaced them comes out.
    for name in ("stdout", "stderr"):
        sys.__dict__[name] = sys.__dict__.get("__" + name + "__")
    ok = _flush_std() and ok
    if not ok:
        status = 120
    if interrupted:
        status = 130  # the interpreter's SIGINT ending, under the init
    os._exit(status)


def _exit_status(e):
    """The exit status of SystemExit e, as the interpreter reads it
    (_Py_HandleSystemExit): its code None is 0; an int (a bool, an int's
    subclass: its value) is that status as C's exit reads a C long, 255
    beyond one; anything else, or e itself where its code cannot be read,
    is printed to stderr with a newline, and is 1."""
    value = e
    try:
        value = e.code
    except BaseException:
        pass
    if value is None:
        return 0
    if issubclass(type(value), int):
        n = int.__index__(value)
        return n & 0xFF if -sys.maxsize - 1 <= n <= sys.maxsize else 255
    stderr = sys.__dict__.get("stderr")
    try:
        if stderr is not None:
            write = stderr.write
            write(str(value))
        else:
            # No sys.stderr: the C library's, as PyObject_Print writes it.
            os.write(2, str(value).encode("utf-8", "backslashreplace"))
    except BaseException:
        pass
    _write_stderr("\n")
    return 1


def _report(e):
    """Reports e, uncaught, as the interpreter does (_PyErr_PrintEx):
    without this launcher's frame, in sys.last_*, through sys.excepthook
    called with no exception being handled; a hook that raises SystemExit
    ends the run with its status, one that raises anything else is
    reported with the original exception. The status is 1, or 130 for a
    KeyboardInterrupt itself (not a subclass)."""
    tb = _own(e.__traceback__)
    e.__traceback__ = tb
    sys.last_type, sys.last_value, sys.last_traceback = type(e), e, tb
    hook = sys.__dict__.get("excepthook", _MISSING)
    failure = None
    if hook is _MISSING:
        _write_stderr("sys.excepthook is missing\n")
        _display(type(e), e, tb)
    else:
        try:
            hook(type(e), e, tb)
        except BaseException as e2:
            failure = e2
    if issubclass(type(failure), SystemExit):
        _exit(_exit_status(failure))
    if failure is not None:
        tb2 = _own(failure.__traceback__)
        failure.__traceback__ = tb2
        _write_stderr("Error in sys.excepthook:\n")
        _display(type(failure), failure, tb2)
        _write_stderr("\nOriginal exception was:\n")
        _display(type(e), e, tb)
        del failure, tb2
    interrupted = type(e) is KeyboardInterrupt
    del e, tb
    _exit(1, interrupted)


# The interpreter's own, whatever the task makes of sys's names.
_display = sys.__excepthook__
_default_unraisablehook = sys.__unraisablehook__
_modules = sys.modules
_MISSING = object()
_source, _path, _globals = _prepare()
_program = _values()["program"]
_error = None
try:
    exec(compile(_program(compile(_source, _path, "exec", 0x400)), _path, "exec"), _globals)
except BaseException as e:
    _error = e
    del e
# What follows runs with no exception being handled, as the interpreter's
# end: the task's excepthook and atexit handlers see none.
if _error is None:
    _exit(0)
if issubclass(type(_error), SystemExit):
    _status = _exit_status(_error)
    del _error
    _exit(_status)
_report(_error)
