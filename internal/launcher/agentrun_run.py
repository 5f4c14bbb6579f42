# agentrun's run launcher (internal/runner/values.go): what shows a Python
# run's values and figures, as a notebook does. It is agentrun's own file,
# mounted read-only at /dev/agentrun-run.py. A cold or pooled run of
# Python code is started as
#
#     <the language's argv, with the launcher's start before FILE:> START FILE ...
#
# where START (runstart.py) runs this file's code in its own namespace, as
# if it were this file (from the bytecode this image's interpreter made of
# it, when agentrun has it). It runs FILE as __main__ the way `python3
# FILE` runs it (argv, sys.path[0], __file__, tracebacks, exit status); a
# warm run's launcher (warm.py) executes this file's source for as_main(),
# start(), program() and the interpreter's end (end, exit_status, report).
#
# start() sets the run up: a display(obj) builtin, matplotlib's Agg
# backend (MPLBACKEND, unless set), a hook on matplotlib.pyplot's show
# that is placed only once the program imports pyplot, and, at exit, the
# figures still open. program(tree) makes a module's last expression
# statement show its value. Nothing here imports a module the
# interpreter's start did not.
#
# This file is what every run needs; the rest of the launcher (runlib.py,
# mounted read-only at RUNLIB: MIME bundles, figures, the interpreter's
# end) is compiled into this file's namespace at its first need (_rest):
# a value shown, display(), pyplot imported, an uncaught exception. The
# interpreter compiles a program's file at each start, and the rest is
# most of the launcher: a run that shows nothing and raises nothing does
# not pay for it.
import os
import sys

RUNLIB = "/dev/agentrun-runlib.py"
# runlib_code is runlib.py's code where a warm launcher compiled it ahead.
runlib_code = None

# What _rest uses, as the launcher's start found them: the task may
# replace builtins before the rest is needed.
_ns = globals()
_open, _compile, _exec = open, compile, exec
_loaded = []


def _rest():
    """Compiles and runs runlib.py in this file's namespace, once: True
    once it is there, False if it cannot be (then nothing is shown)."""
    if _loaded:
        return True
    try:
        code = runlib_code
        if code is None:
            with _open(RUNLIB, "rb") as f:
                code = _compile(f.read(), RUNLIB, "exec")
        _exec(code, _ns)
    except Exception:
        return False
    _loaded.append(True)
    return True


def display(*objs, **kwargs):
    """Shows each of objs in the run's result, as IPython's display does."""
    if _rest():
        _display_objs(objs)


def _show_value(value):
    """Called with the value of a module's last expression statement."""
    if value is not None and _rest():
        _show(value)


class _Finder:
    """Finds matplotlib.pyplot, once, through the launcher's library
    (runlib.py's _find_pyplot), which hooks its show."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != "matplotlib.pyplot" or not _rest():
            return None
        return _find_pyplot(cls, name, path, target)


def _at_exit():
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None and _rest():
        _show_figures(pyplot, False)


def start():
    """Sets the run up before its code runs."""
    import builtins
    import atexit

    builtins.display = display
    builtins.__agentrun_value__ = _show_value
    os.environ.setdefault("MPLBACKEND", "Agg")
    atexit.register(_at_exit)
    if "matplotlib.pyplot" in sys.modules:
        if _rest():
            _hook_pyplot(sys.modules["matplotlib.pyplot"])
    else:
        sys.meta_path.insert(0, _Finder)


def program(tree):
    """tree (a module's AST, from compile with PyCF_ONLY_AST) with its
    last statement, if an expression, passed to __agentrun_value__."""
    body = tree.body
    if not body or type(body[-1]).__name__ != "Expr":
        return tree
    last = body[-1]
    call = compile("__agentrun_value__(_)", "<agentrun>", "eval", _ONLY_AST).body
    call.args[0] = last.value
    for node in (call, call.func):
        node.lineno, node.col_offset = last.lineno, last.col_offset
        node.end_lineno, node.end_col_offset = last.end_lineno, last.end_col_offset
    last.value = call
    return tree


_ONLY_AST = 0x400  # ast.PyCF_ONLY_AST, without importing ast


# The interpreter's end, as CPython's C code does it (_Py_HandleSystemExit,
# _PyErr_PrintEx, Py_FinalizeEx), for warm.py's runs and, on an uncaught
# exception, for this launcher's own. The interpreter's own hooks and
# modules, whatever the task makes of sys's names.
_display = sys.__excepthook__
_default_unraisablehook = sys.__unraisablehook__
_modules = sys.modules
_MISSING = object()

# launchers are the globals of the launchers' frames, left out of a
# reported traceback: this file's, and warm.py's, which adds its own.
launchers = [globals()]


def as_main(argv, launcher, extra):
    """Makes argv[0] the program as `python3 FILE ARG...` makes it:
    sys.argv is argv, sys.path[0] the file's directory, sys.orig_argv
    without launcher's file and its extra arguments, and a new __main__
    module for the file; returns the file's source, its path and the
    module's namespace. This launcher's and warm.py's."""
    path = argv[0]
    sys.argv[:] = argv
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    orig = getattr(sys, "orig_argv", None)
    if orig is not None and launcher in orig:
        i = orig.index(launcher)
        sys.orig_argv = orig[:i] + orig[i + 1 + extra:]
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


# The state of a run with keep_state (state.go): the request agentrun put
# in the display directory, state.py's module, the report written back.
STATE_REQUEST = "/dev/agentrun-display/state-request"
STATE_MODULE = "/dev/agentrun-state.py"
# state_code is state.py's code where a warm launcher compiled it ahead.
state_code = None


def state_begin(main):
    """Reads agentrun's state request: None for a run without state.
    Otherwise state.py's begin removes the state (reset) or restores it
    into namespace main (keep), and this returns what state_end needs."""
    try:
        with open(STATE_REQUEST, "rb") as f:
            fields = dict(kv.split("=", 1) for kv in f.read(4096).decode().split())
        keep, reset, limit, path = fields["keep"] == "1", fields["reset"] == "1", int(fields["max"]), fields["file"]
    except (OSError, ValueError, KeyError):
        return None
    mod = type(sys)("agentrun_state")
    mod.__file__ = STATE_MODULE
    try:
        code = state_code
        if code is None:
            with open(STATE_MODULE, "rb") as f:
                code = compile(f.read(), STATE_MODULE, "exec")
        exec(code, mod.__dict__)
    except BaseException as e:
        return {"keep": False, "error": "the state module failed: %s: %s" % (type(e).__name__, e)}
    sys.modules["agentrun_state"] = mod
    before = _fignums()
    st = mod.begin(main, keep, reset, limit, path)
    _close_restored(before)
    st["mod"] = mod
    return st


def _fignums():
    """The numbers of the figures open in pyplot, if it is imported."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    try:
        return set(pyplot.get_fignums()) if pyplot is not None else set()
    except Exception:
        return set()


def _close_restored(before):
    """Closes the figures that the state's restore opened in pyplot (a
    figure pickled while open opens itself again when unpickled): a
    restored figure is not this run's output, as a notebook's figures are
    closed after the cell that made them. It stays what the globals hold,
    shown where the code shows it (display, its last expression)."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    for num in _fignums() - before:
        try:
            pyplot.close(num)
        except Exception:
            pass


def state_end(st, main):
    """Saves the state of namespace main (a run with keep_state) and writes
    the report agentrun reads (state.py's end); never fails the run."""
    if st is not None and st["keep"]:
        st["mod"].end(st, main)


if __name__ == "__main__":
    _source, _path, _globals = as_main(sys.argv[1:], __file__, 0)
    start()
    _state = state_begin(_globals)
    _error = None
    try:
        exec(compile(program(compile(_source, _path, "exec", _ONLY_AST)), _path, "exec"), _globals)
    except SystemExit:
        state_end(_state, _globals)
        raise
    except BaseException as e:
        _error = e
        del e
    state_end(_state, _globals)
    if _error is not None:
        if not _rest():
            raise _error  # reported by the interpreter itself
        report(_error, _cold_end)
