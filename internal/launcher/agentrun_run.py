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
# as_main(), start(), run(), state_begin() and state_end(), and the
# interpreter's end from lib() (end, exit_status, report).
#
# start() sets the run up: a display(obj) builtin, matplotlib's Agg
# backend (MPLBACKEND, unless set), a hook on matplotlib.pyplot's show
# that is placed only once the program imports pyplot, and, at exit, the
# figures still open. run() runs a module, its last expression
# statement's value shown: from split()'s pieces where it can, else
# through program(tree), which makes the statement a call. Nothing here
# imports a module the interpreter's start did not.
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
_open, _compile, _exec, _eval, _module = open, compile, exec, eval, type(sys)
_gettrace, _settrace, _getframe = sys.gettrace, sys.settrace, getattr(sys, "_getframe", None)
_lib = []


def load(name, path, code=None):
    """A new module name from agentrun's file at path: from code where it
    was compiled ahead, else compiled from the file (without compile():
    _compiled). It is in no sys.modules."""
    mod = _module(name)
    mod.__file__ = path
    if code is None:
        with _open(path, "rb") as f:
            code = _compiled(f.read(), path, "exec")
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


# The fast way to a module's last expression statement (split()).
# program()'s way costs a cold run twice: compile() asks first whether its
# source is an AST, which makes the interpreter's AST node types the first
# time (about 120 classes, some 2 ms of a cold print(45)'s CPU), and the
# tree is made into Python objects and back (a millisecond for fifty
# lines). Most programs are a module's statements, PRE, then a last
# expression statement, LAST, whose first line starts at column 0;
# split() compiles them apart, without compile() (_compiled()), PRE as a
# module and LAST as an expression, and where both compile, running PRE,
# then showing LAST's value, is running the module with program()'s
# change (run()), because:
#
# - The tokenizer reads left to right, and its state at the start of a
#   line is the open brackets, an open string, a backslash continuation
#   and the stack of indents. PRE, which ends at a line's end, compiles
#   only if none of the first three is open at its end (an open bracket,
#   an unterminated string or a trailing backslash is an error at its end
#   of input), and LAST's first line starts at column 0 with neither a
#   blank, a comment nor a closing bracket, which closes every indent. So from LAST's first
#   line on, the whole source gives the tokens LAST alone gives (with as
#   many blank lines before it, which give none: the same lines and
#   columns), and before it the tokens PRE gives, the indents PRE closes
#   at its end closed at LAST's line instead.
# - PRE's tokens are whole statements (it compiles as a module), and
#   LAST's compile as the eval input, `expressions NEWLINE* ENDMARKER`:
#   no `;`, `=`, annotation or keyword that starts a statement at its top
#   level, so the module's grammar reads them as one expression statement
#   (the assignment tried before it needs a top-level `=`, a `match` a
#   top-level `:`), with the same tree. A last line that goes on a
#   statement (`else:`, `except:`, a decorated `def`, a `)` or a string's
#   end) or is not an expression (`x = 1`, `a; b`, `if x:`, `yield`,
#   `await` at the top level) fails to compile on one side or the other:
#   then program()'s way is taken, and it reports the errors.
# - What a module's compile makes of one statement depends on the others
#   only through __future__ imports (not taken: a source that names
#   __future__), the docstring (PRE's first statement, PRE's as the
#   module's: LAST is never one, program() makes it a call), the
#   annotations' set-up (PRE's alone: LAST has none) and its line numbers
#   and columns (kept). LAST runs as the module's code runs it: with the
#   module's namespace as its globals and locals, and the builtins the
#   module's frame would have, taken before PRE runs (a function's, fixed
#   at its making), its value given to __agentrun_value__ as program()'s
#   call gives it, the name looked up first. A source that names
#   __builtins__ or __agentrun_value__ takes program()'s way.
# - The source is decoded as the interpreter decodes its file, UTF-8: not
#   taken with a coding declaration, a BOM, a CR (a line end of its own)
#   or a form feed (which resets a line's column). Nor when a piece would
#   warn: compiled apart they would warn again in program()'s way, which
#   warns once.
#
# What differs: LAST runs in a frame of its own, as the code of a
# function does (a tracer sees it called); an exception that a value's
# display itself raises (a __repr__ that raises KeyboardInterrupt) is
# reported without the module's frame at LAST's line; and a LAST nested
# too deep for program()'s tree (a RecursionError while it is made) runs,
# as `python3 FILE` runs it.


def split(source, path):
    """The code of source (a module's, bytes) at path as (PRE, LAST): its
    statements before its last expression statement, and that
    expression's (None where it has none), compiled apart; None where
    program()'s way must be taken."""
    if type(source) is not bytes or source[:3] == b"\xef\xbb\xbf":
        return None
    for word in (b"\r", b"\f", b"__future__", b"__builtins__", b"__agentrun_value__"):
        if word in source:
            return None
    first = source.find(b"\n")
    second = source.find(b"\n", first + 1) if first >= 0 else -1
    if b"coding" in (source if second < 0 else source[:second]):
        return None
    # LAST's first line: the last that starts with neither a blank nor a
    # comment, nor a closing bracket (the end of a call or a list laid out
    # over lines, which LAST holds).
    end = len(source)
    while True:
        start = source.rfind(b"\n", 0, end) + 1
        c = source[start : start + 1]
        if c and c not in b" \t#\n)]}":
            break
        if start == 0:
            start = len(source)  # no such line: no LAST
            break
        end = start - 1
    filters = _warning_filters()
    if filters is None:
        return None
    filters.insert(0, _WARNINGS_ERROR)
    try:
        last = None
        if start < len(source):
            last = _compiled(b"\n" * source.count(b"\n", 0, start) + source[start:], path, "eval")
        return _compiled(source[:start], path, "exec"), last
    except Exception:
        return None
    finally:
        for i, f in enumerate(filters):
            if f is _WARNINGS_ERROR:
                del filters[i]
                break


def _compiled(source, path, mode):
    """The code that compile(source, path, mode, dont_inherit=True) makes
    (mode "exec" or "eval"), made without compile(): compile() asks first
    whether its source is an AST, and the first time in a process that
    makes the AST's node types (about 120 classes, 2 ms of a cold
    print(45)'s CPU), which exec and eval of a source do not. exec or eval
    compiles source as the interpreter's own file, "<string>" its file
    name; a trace function takes its code as it is called and stops it
    before its first instruction; and the code's file names become path,
    as the import system's own _imp._fix_co_filename makes them for
    bytecode moved. Where a trace function is set (a debugger's, a
    coverage's), compile() makes it."""
    if _gettrace() is not None or _fix_co_filename is None or _getframe is None:
        return _compile(source, path, mode, 0, True)
    code = []
    here = _getframe()

    def take(frame, event, arg):
        # The code's own frame, called from here: not an audit hook's
        # that the exec calls first (one that lets itself be traced).
        c = frame.f_code
        if frame.f_back is not here or c.co_filename != "<string>" or c.co_name != "<module>":
            return None
        code.append(c)
        raise _Taken

    _settrace(take)
    try:
        (_exec if mode == "exec" else _eval)(source, {"__builtins__": {}})  # none, were it run
    except _Taken:
        pass
    finally:
        _settrace(None)
    if not code:
        raise _Taken("the trace function was not called")
    _fix_co_filename(code[0], path)
    return code[0]


class _Taken(Exception):
    """The code's call, stopped by _compiled()'s trace function."""


_fix_co_filename = getattr(sys.modules.get("_imp"), "_fix_co_filename", None)


# What split() puts first among the warnings' filters while it compiles:
# a warning is an error, and the compile fails.
_WARNINGS_ERROR = ("error", None, Warning, None, 0)


def _warning_filters():
    """The list of filters the interpreter's warnings use: the warnings
    module's, where it is imported, else _warnings'; None if not a list."""
    mod = sys.modules.get("warnings")
    if mod is None:
        mod = sys.modules.get("_warnings")
    filters = getattr(mod, "filters", None)
    return filters if type(filters) is list else None


_function = type(split)
_dict = type({})


def run(source, path, globals_, code):
    """Runs source, the module at path, in namespace globals_, its last
    expression statement's value shown: from code, split()'s pieces, or
    else by program()."""
    if code is None:
        exec(compile(program(compile(source, path, "exec", _ONLY_AST)), path, "exec"), globals_)
        return
    pre, last = code
    if last is not None:
        last = _function(last, globals_)
        builtins = globals_.get("__builtins__")
        if type(builtins) is _module:
            builtins = builtins.__dict__
    exec(pre, globals_)
    if last is not None:
        show = globals_.get("__agentrun_value__", _MISSING)
        if show is _MISSING and type(builtins) is _dict:
            show = builtins.get("__agentrun_value__", _MISSING)
        if show is _MISSING:
            raise _NameError("name '__agentrun_value__' is not defined")
        show(last())


_MISSING = object()
_NameError = NameError


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
    # Before any other code runs (a state's restore): split() sets a
    # trace function and turns warnings into errors for a moment.
    code = split(source, path)
    start()
    state = state_begin(globals_)
    error = None
    try:
        run(source, path, globals_, code)
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
