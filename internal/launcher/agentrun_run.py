# agentrun's run launcher (internal/launcher): what shows a Python run's
# values and figures, as a notebook does, and runs a kept session's state
# in and out. It is agentrun's own file, mounted read-only at RUN
# (/dev/agentrun-python/agentrun_run.py). A cold or pooled run of Python
# code is started as
#
#     <the language's argv, with the launcher's start before FILE:> START FILE ...
#
# where START (agentrun_start.py) loads this file as the module
# agentrun_run (from the bytecode this image's interpreter made of it,
# when agentrun has it) and calls its main(), which runs FILE as __main__
# the way `python3 FILE` runs it (argv, sys.path[0], __file__, tracebacks,
# exit status); a warm run's launcher (agentrun_warm.py) loads it too, for
# as_main(), start(), program(), state_begin() and state_end(), and the
# interpreter's end from lib() (end, exit_status, report).
#
# start() sets the run up: a display(obj) builtin, matplotlib's Agg
# backend (MPLBACKEND, unless set), a hook on matplotlib.pyplot's show
# that is placed only once the program imports pyplot, and, at exit, the
# figures still open. program(tree) makes a module's last expression
# statement show its value. Nothing here imports a module the
# interpreter's start did not.
#
# This file is what every run needs; the rest of the launcher
# (agentrun_runlib.py, mounted read-only at RUNLIB: MIME bundles, figures,
# the interpreter's end) is loaded at its first need (lib()): a value
# shown, display(), pyplot imported, an uncaught exception. The
# interpreter compiles a program's file at each start, and the rest is
# most of the launcher: a run that shows nothing and raises nothing does
# not pay for it.
#
# agentrun's modules are loaded by load(), not imported: an import would
# look through the task's sys.path, sys.meta_path and builtins, which its
# code may have changed by the time the rest is needed, and would leave
# them in sys.modules, where the task sees them (agentrun_state alone is
# put there: a kept state names its functions).
import os
import sys

RUNLIB = "/dev/agentrun-python/agentrun_runlib.py"
# runlib_code is agentrun_runlib.py's code where a warm launcher compiled
# it ahead.
runlib_code = None

# What load uses, as the launcher's start found them: the task may
# replace builtins before the rest is needed.
_open, _compile, _exec, _module = open, compile, exec, type(sys)
_lib = []


def load(name, path, code=None):
    """A new module name from agentrun's file at path: from code where it
    was compiled ahead, else compiled from the file. It is in no
    sys.modules."""
    mod = _module(name)
    mod.__file__ = path
    if code is None:
        with _open(path, "rb") as f:
            code = _compile(f.read(), path, "exec")
    _exec(code, mod.__dict__)
    return mod


def lib():
    """The rest of the launcher, agentrun_runlib, loaded once and given
    what this module found at the launcher's start; None if it cannot be
    (then nothing is shown)."""
    if _lib:
        return _lib[0]
    try:
        mod = load("agentrun_runlib", RUNLIB, runlib_code)
        mod.launchers, mod.at_exit = launchers, _at_exit
        mod.excepthook, mod.default_unraisablehook, mod.modules = _excepthook, _unraisablehook, _modules
    except Exception:
        return None
    # Its frames are the launcher's, left out of a reported traceback.
    launchers.append(mod.__dict__)
    _lib.append(mod)
    return mod


def display(*objs, **kwargs):
    """Shows each of objs in the run's result, as IPython's display does."""
    rest = lib()
    if rest is not None:
        rest.display_objs(objs)


def _show_value(value):
    """Called with the value of a module's last expression statement."""
    if value is not None:
        rest = lib()
        if rest is not None:
            rest.show_value(value)


class _Finder:
    """Finds matplotlib.pyplot, once, through the launcher's library
    (agentrun_runlib's find_pyplot), which hooks its show."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != "matplotlib.pyplot":
            return None
        rest = lib()
        if rest is None:
            return None
        return rest.find_pyplot(cls, name, path, target)


def _at_exit():
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        rest = lib()
        if rest is not None:
            rest.show_figures(pyplot, False)


def start():
    """Sets the run up before its code runs."""
    import builtins
    import atexit

    builtins.display = display
    builtins.__agentrun_value__ = _show_value
    os.environ.setdefault("MPLBACKEND", "Agg")
    atexit.register(_at_exit)
    if "matplotlib.pyplot" in sys.modules:
        rest = lib()
        if rest is not None:
            rest.hook_pyplot(sys.modules["matplotlib.pyplot"])
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


# The interpreter's own hooks and modules, as the launcher's start found
# them, whatever the task makes of sys's names: the interpreter's end
# (agentrun_runlib's end and report) uses them.
_excepthook = sys.__excepthook__
_unraisablehook = sys.__unraisablehook__
_modules = sys.modules

# launchers are the globals of the launchers' frames, left out of a
# reported traceback: this module's, the launcher's start's or warm
# launcher's (each adds its own), and agentrun_runlib's once loaded.
launchers = [globals()]


def as_main(argv, launcher, extra):
    """Makes argv[0] the program as `python3 FILE ARG...` makes it:
    sys.argv is argv, sys.path[0] the file's directory, sys.orig_argv
    without launcher's file and its extra arguments, and a new __main__
    module for the file; returns the file's source, its path and the
    module's namespace. main()'s, and the warm launcher's."""
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


# The state of a run with keep_state (internal/launcher, state.go): the
# request agentrun put in the display directory, the state's module
# (agentrun_state.py), the report written back.
STATE_REQUEST = "/dev/agentrun-display/state-request"
STATE_MODULE = "/dev/agentrun-python/agentrun_state.py"
# state_code is agentrun_state.py's code where a warm launcher compiled it
# ahead.
state_code = None


def state_begin(main):
    """Reads agentrun's state request: None for a run without state.
    Otherwise agentrun_state's begin removes the state (reset) or
    restores it into namespace main (keep), and this returns what
    state_end needs."""
    try:
        with open(STATE_REQUEST, "rb") as f:
            fields = dict(kv.split("=", 1) for kv in f.read(4096).decode().split())
        keep, reset, limit, path = fields["keep"] == "1", fields["reset"] == "1", int(fields["max"]), fields["file"]
    except (OSError, ValueError, KeyError):
        return None
    try:
        mod = load("agentrun_state", STATE_MODULE, state_code)
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
    the report agentrun reads (agentrun_state's end); never fails the
    run."""
    if st is not None and st["keep"]:
        st["mod"].end(st, main)


def main(launcher, own):
    """Runs a cold or pooled run's code file, sys.argv[1], from the
    launcher's start (launcher, its file; own, its globals)."""
    launchers.append(own)
    source, path, globals_ = as_main(sys.argv[1:], launcher, 0)
    start()
    state = state_begin(globals_)
    error = None
    try:
        exec(compile(program(compile(source, path, "exec", _ONLY_AST)), path, "exec"), globals_)
    except SystemExit:
        state_end(state, globals_)
        raise
    except BaseException as e:
        error = e
        del e
    state_end(state, globals_)
    if error is not None:
        rest = lib()
        if rest is None:
            raise error  # reported by the interpreter itself
        rest.report(error, rest.cold_end)
