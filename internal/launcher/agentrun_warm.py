# agentrun's warm launcher (internal/launcher; the pool's side is
# internal/runner's warm.go). It is the program of a warm pooled sandbox,
# started under every restriction of the sandbox as
#
#     <the language's argv, with {file} replaced by:> LAUNCHER FD PRELOAD FILE
#
# and is agentrun's own file, mounted read-only: no image can change it. It
# imports the modules of PRELOAD (comma-separated) with its output sent to
# /dev/null, compiles agentrun's run launcher, its library and the state
# module (RUN, RUNLIB, STATE), says "ready" (or "fail REASON") on the
# socket at descriptor FD, and waits. At the run's take agentrun has written the task's files
# and code into /workspace; it says "go", the launcher says "ok", waits for
# agentrun to close its end, closes its own, and runs FILE as __main__ the
# way `python3 FILE` runs it: the task's own code, argv, sys.path[0],
# traceback, exit status and atexit handlers. It imports nothing that the
# interpreter's own start does not: the task sees sys.modules as a cold
# run's, plus the preloaded modules. It reads a SystemExit, reports an
# uncaught exception and ends the interpreter as CPython's own C code does
# (agentrun_runlib's exit_status, report and end), without the teardown of
# every module.
# One thing it cannot see: sys.exit(VALUE) hands the interpreter VALUE
# itself, which an except clause (this launcher's, or any the exception
# passes through in a cold run) gets as SystemExit(VALUE) made from it, so
# that sys.exit(()) and sys.exit((3,)) read as SystemExit() and
# SystemExit(3), and an exception with a code attribute as SystemExit(it).
# Values and figures are shown, and a kept session's state restored and
# saved, by agentrun's run launcher (agentrun_run.py, mounted at RUN), as
# in a cold run.
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
    # matplotlib's backend, as the run launcher's start() sets it (a
    # preloaded pyplot reads it at its import); the task's env may set it.
    os.environ.setdefault("MPLBACKEND", "Agg")
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
    if failure is None:
        try:
            _compile()
        except BaseException as e:
            failure = "compiling agentrun's launchers: %s: %s" % (type(e).__name__, e)
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
    # A run in a kept session had the session's disk mounted on
    # /workspace at the take: the cwd, made before, is entered again.
    os.chdir(os.getcwd())
    return argv


RUN = "/dev/agentrun-python/agentrun_run.py"
RUNLIB = "/dev/agentrun-python/agentrun_runlib.py"
STATE = "/dev/agentrun-python/agentrun_state.py"

# The launchers' code, compiled before the take (agentrun's own files,
# read-only; compiling runs none of it): a run does not wait for it.
_code = {}


def _compile():
    for path in (RUN, RUNLIB, STATE):
        with open(path, "rb") as f:
            _code[path] = compile(f.read(), path, "exec")
    # The compiles above made the interpreter's AST node types, and one to
    # an AST here readies the rest of that way: a run's own
    # (agentrun_run's program()) does not wait for it. A cold run skips
    # it where it can (agentrun_run's split()); a warm run need not, and
    # sets no trace function or warning filter after the preloads ran.
    compile("", "<agentrun>", "exec", 0x400)


def _launcher():
    """The run launcher, the module agentrun_run (made here as its start
    makes it, in no sys.modules): as_main() makes the task's file __main__,
    start() sets the run up, run() runs the code, its last expression's
    value shown, state_begin() and state_end() restore and save a kept
    session's state (with agentrun_state.py's code, compiled here). Its
    library, agentrun_runlib, is loaded here too: a warm run has it all."""
    run = type(sys)("agentrun_run")
    run.__file__ = RUN
    exec(_code[RUN], run.__dict__)
    run.state_code = _code[STATE]
    run.runlib_code = _code[RUNLIB]
    if run.lib() is None:
        os.write(2, b"agentrun: the run launcher's library (agentrun_runlib.py) failed\n")
        os._exit(1)
    return run


# The interpreter's own ending, in agentrun_runlib (end, exit_status,
# report).
_argv = _prepare()
_run = _launcher()
_lib = _run.lib()
# This launcher's file and its two arguments (FD, PRELOAD) are not the task's.
_source, _path, _globals = _run.as_main(_argv, __file__, 2)
_run.start()
_run.launchers.append(globals())
_end, _exit_status, _report = _lib.end, _lib.exit_status, _lib.report
# A run with keep_state: restored before the code, saved after it
# (exited, raised or not), as in a cold run (agentrun_run's state_begin
# and state_end).
_state = _run.state_begin(_globals)
_error = None
try:
    _run.run(_source, _path, _globals, None)
except BaseException as e:
    _error = e
    del e
_run.state_end(_state, _globals)
# What follows runs with no exception being handled, as the interpreter's
# end: the task's excepthook and atexit handlers see none.
if _error is None:
    _end(0)
if issubclass(type(_error), SystemExit):
    _status = _exit_status(_error)
    del _error
    _end(_status)
_report(_error, _end)
