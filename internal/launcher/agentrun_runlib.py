# The rest of agentrun's run launcher (agentrun_run.py): what only some
# runs need, loaded as the module agentrun_runlib at its first need
# (agentrun_run's lib()), which gives it what it found at the launcher's
# start. It is agentrun's own file, mounted read-only at
# /dev/agentrun-python/agentrun_runlib.py.
#
# Each value and each displayed object is written as one JSON line,
# {"value": BUNDLE} or {"display": BUNDLE}, to CHANNEL, which agentrun
# reads, bounds and checks after the run. A bundle maps MIME types to
# strings (image/png as base64). Nothing here imports a module the
# interpreter's start did not, but where an object asks for it (binascii
# for a PNG, json for _repr_json_). The interpreter's end (end,
# exit_status, report) uses the hooks and modules agentrun_run found at
# the launcher's start.
import os
import sys

CHANNEL = "/dev/agentrun-display/bundles"

# What agentrun_run found at the launcher's start, before any of the
# task's code ran, set by its lib() as it loads this module: the globals
# of the launchers' frames, left out of a reported traceback (_own), its
# atexit handler (which shows the figures still open), and the
# interpreter's own sys.__excepthook__, sys.__unraisablehook__ and
# sys.modules, whatever the task makes of sys's names.
launchers = []
at_exit = excepthook = default_unraisablehook = modules = None

_MISSING = object()


# The _repr_*_ methods of IPython's display protocol, by MIME type.
_REPRS = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("text/latex", "_repr_latex_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("application/json", "_repr_json_"),
)


_MIMES = frozenset(["text/plain"] + [m for m, _ in _REPRS])


_shown = []  # the figures shown as a value or by display: not again at the end


def _json_str(s):
    out = ['"']
    for c in s:
        o = ord(c)
        if c == '"' or c == "\\":
            out.append("\\" + c)
        elif o < 0x20 or 0xD800 <= o < 0xE000:
            out.append("\\u%04x" % o)
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


def _write(kind, bundle):
    line = "{%s: {%s}}\n" % (
        _json_str(kind),
        ", ".join("%s: %s" % (_json_str(k), _json_str(v)) for k, v in bundle.items()),
    )
    data = line.encode("utf-8", "replace")
    try:
        fd = os.open(CHANNEL, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError:
        return
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass
    finally:
        os.close(fd)


def _text(v):
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return v if isinstance(v, str) else None


def _b64(v):
    if isinstance(v, str):  # already base64, as IPython takes it
        return v.replace("\n", "")
    if isinstance(v, (bytes, bytearray)):
        import binascii

        return binascii.b2a_base64(bytes(v), newline=False).decode("ascii")
    return None


def _value(mime, v):
    """v, a _repr_*_ answer for mime, as the bundle's string; None if it
    gives none."""
    if isinstance(v, tuple) and len(v) == 2:  # (data, metadata)
        v = v[0]
    if v is None:
        return None
    if mime in ("image/png", "image/jpeg"):
        return _b64(v)
    if mime == "application/json":
        if isinstance(v, str):
            return v
        import json

        return json.dumps(v)
    return _text(v)


def _figure_png(fig):
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _is_figure(obj):
    t = type(obj)
    return (getattr(t, "__module__", "") or "").split(".")[0] == "matplotlib" and hasattr(obj, "savefig")


def bundle(obj):
    """obj's MIME bundle: text/plain (its repr) and what its _repr_*_
    methods or _repr_mimebundle_ offer. An object whose method raises
    gives what the others do."""
    b = {}
    mb = getattr(obj, "_repr_mimebundle_", None)
    if callable(mb) and not isinstance(obj, type):
        try:
            data = mb(include=None, exclude=None)
            if isinstance(data, tuple):
                data = data[0]
            for mime, v in (data or {}).items():
                if mime in _MIMES:
                    s = _value(mime, v) if mime != "text/plain" else _text(v)
                    if s is not None:
                        b[mime] = s
        except Exception:
            pass
    if not isinstance(obj, type):
        for mime, name in _REPRS:
            if mime in b:
                continue
            f = getattr(obj, name, None)
            if not callable(f):
                continue
            try:
                s = _value(mime, f())
            except Exception:
                continue
            if s is not None:
                b[mime] = s
        if "image/png" not in b and _is_figure(obj):
            try:
                b["image/png"] = _b64(_figure_png(obj))
            except Exception:
                pass
    if "text/plain" not in b:
        try:
            b["text/plain"] = repr(obj)
        except Exception as e:
            b["text/plain"] = "<%s object: repr failed: %s>" % (type(obj).__name__, type(e).__name__)
    return b


def display_objs(objs):
    """Shows each of objs in the run's result (display)."""
    for obj in objs:
        if _is_figure(obj):
            _shown.append(obj)
        _write("display", bundle(obj))


def show_value(value):
    """Shows value, not None, as the value of the code's last expression."""
    if _is_figure(value):
        _shown.append(value)
    _write("value", bundle(value))


def show_figures(pyplot, close):
    try:
        nums = list(pyplot.get_fignums())
    except Exception:
        return
    for num in nums:
        try:
            fig = pyplot.figure(num)
        except Exception:
            continue
        if not any(fig is f for f in _shown):
            display_objs((fig,))
    if close:
        try:
            pyplot.close("all")
        except Exception:
            pass


def hook_pyplot(pyplot):
    real = getattr(pyplot, "show", None)

    def show(*args, **kwargs):
        """Shows every open figure in the run's result and closes it."""
        show_figures(pyplot, True)

    if real is not None:
        show.__doc__ = real.__doc__
    pyplot.show = show
    # pyplot's import registers an atexit handler that destroys every
    # figure (Gcf.destroy_all): the handler that shows those still open
    # moves after it, so as to run before it.
    import atexit

    atexit.unregister(at_exit)
    atexit.register(at_exit)


def _own(tb):
    """tb without its first entries that are a launcher's frames (this
    module's, agentrun_run's, and the launcher's start's or the warm
    launcher's: launchers): the interpreter reports an exception from the
    task's frames only."""
    while tb is not None and any(tb.tb_frame.f_globals is g for g in launchers):
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
        hook = default_unraisablehook
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
            default_unraisablehook(type(args)((type(failure), failure, tb, msg, hook)))
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


def end(status, interrupted=False):
    """Ends the interpreter as its own end does what a program can see
    (Py_FinalizeEx: non-daemon threads joined, atexit handlers run, output
    flushed, 120 if that fails; 130 after an uncaught KeyboardInterrupt),
    but without tearing every module down: the preloads' teardown (pandas')
    would cost the run tens of milliseconds of CPU after its code ended."""
    threading = modules.get("threading")
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


def exit_status(e):
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


def report(e, finish):
    """Reports e, uncaught, as the interpreter does (_PyErr_PrintEx):
    without the launchers' frames, in sys.last_*, through sys.excepthook
    called with no exception being handled; a hook that raises SystemExit
    ends the run with its status, one that raises anything else is
    reported with the original exception. The run then ends through
    finish(status, interrupted): status 1, interrupted for a
    KeyboardInterrupt itself (not a subclass)."""
    tb = _own(e.__traceback__)
    e.__traceback__ = tb
    sys.last_type, sys.last_value, sys.last_traceback = type(e), e, tb
    hook = sys.__dict__.get("excepthook", _MISSING)
    failure = None
    if hook is _MISSING:
        _write_stderr("sys.excepthook is missing\n")
        excepthook(type(e), e, tb)
    else:
        try:
            hook(type(e), e, tb)
        except BaseException as e2:
            failure = e2
    if issubclass(type(failure), SystemExit):
        finish(exit_status(failure), False)
    if failure is not None:
        tb2 = _own(failure.__traceback__)
        failure.__traceback__ = tb2
        _write_stderr("Error in sys.excepthook:\n")
        excepthook(type(failure), failure, tb2)
        _write_stderr("\nOriginal exception was:\n")
        excepthook(type(e), e, tb)
        del failure, tb2
    interrupted = type(e) is KeyboardInterrupt
    del e, tb
    finish(1, interrupted)


class _Loader:
    """Loads matplotlib.pyplot with its own loader, then hooks its show."""

    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        hook_pyplot(module)


def find_pyplot(finder, name, path, target):
    """matplotlib.pyplot's spec, found by the other finders once finder
    (agentrun_run's, which asks only for it) has left sys.meta_path, with a
    loader that hooks its show."""
    try:
        sys.meta_path.remove(finder)
    except ValueError:
        pass
    for f in sys.meta_path:
        find = getattr(f, "find_spec", None)
        if find is None:
            continue
        spec = find(name, path, target)
        if spec is not None:
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _Loader(spec.loader)
            return spec
    return None


def cold_end(status, interrupted):
    """Ends a cold run after an uncaught exception: through the
    interpreter's own end (SystemExit with the status, raised where no
    exception is being handled); after a KeyboardInterrupt, as the
    interpreter's SIGINT ending reads under the sandbox's init (end)."""
    if interrupted:
        end(status, True)
    raise SystemExit(status)
