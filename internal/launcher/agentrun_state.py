# agentrun's kept state (keep_state): the globals of __main__ that one run
# of a kept session leaves, restored at the start of the next. It runs
# inside the sandbox only, under every restriction of the run: the host
# never parses a state, it is the program's own bytes. agentrun puts the
# session's state at the request's file before the run (a copy of its
# own, which no sandbox can write), and takes the file the run leaves
# there as the session's next state only when end's report says it was
# saved, and only within the cap by its size (internal/runner, state.go).
#
# A state file holds, after its magic line, a pickle of a dict: "modules"
# (global name -> module name, imported again by name) and "chunks", each
# a pickle of some globals. The globals are pickled together where they
# can be (objects they share stay shared), and apart from those that
# cannot, which are left out and named with the reason. Functions,
# lambdas, closures and classes that __main__ defined are pickled by
# value (their code, defaults, closure cells, class dict), so a later run
# can call them; everything else as pickle does. A chunk that cannot be
# restored (a module since removed, another Python) drops its names, with
# the reason, and never fails the run.
import io
import marshal
import os
import pickle
import sys
import types

MAGIC = b"agentrun-state 1 " + sys.version.split()[0].encode() + b"\n"
_PROTOCOL = pickle.HIGHEST_PROTOCOL


def _reason(e):
    text = " ".join(str(e).split())[:200]
    return "%s: %s" % (type(e).__name__, text) if text else type(e).__name__


def _unserialisable(obj, e):
    return "%s: cannot be serialised (%s)" % (type(obj).__name__, _reason(e))


class _Pickler(pickle.Pickler):
    """pickle, with __main__'s functions and classes by value and its
    namespace and modules by name."""

    def __init__(self, f, main):
        super().__init__(f, protocol=_PROTOCOL)
        self._main = main

    def persistent_id(self, obj):
        if obj is self._main:
            return "main"
        if isinstance(obj, types.ModuleType):
            return ("module", obj.__name__)
        return None

    def reducer_override(self, obj):
        if isinstance(obj, types.FunctionType) and obj.__module__ == "__main__":
            cells = obj.__closure__ or ()
            state = {
                "defaults": obj.__defaults__,
                "kwdefaults": obj.__kwdefaults__,
                "qualname": obj.__qualname__,
                "doc": obj.__doc__,
                "dict": obj.__dict__ or None,
                "annotations": obj.__annotations__ or None,
                "cells": [_cell(c) for c in cells],
            }
            return (_function, (marshal.dumps(obj.__code__), self._main, obj.__name__, len(cells)),
                    state, None, None, _set_function)
        if isinstance(obj, type) and obj.__module__ == "__main__" and obj.__qualname__ == obj.__name__:
            d = {k: v for k, v in obj.__dict__.items() if k not in ("__dict__", "__weakref__")}
            slots = d.pop("__slots__", None)
            if slots is not None:
                for s in [slots] if isinstance(slots, str) else slots:
                    d.pop(s, None)
            return (_class, (type(obj), obj.__name__, obj.__bases__, slots), d, None, None, _set_class)
        return NotImplemented


def _cell(c):
    """(True, contents), or (False, None) for a cell not yet assigned."""
    try:
        return True, c.cell_contents
    except ValueError:
        return False, None


def _function(code, globals_, name, ncells):
    cells = tuple(types.CellType() for _ in range(ncells))
    return types.FunctionType(marshal.loads(code), globals_, name, None, cells or None)


def _set_function(f, state):
    f.__defaults__ = state["defaults"]
    f.__kwdefaults__ = state["kwdefaults"]
    f.__qualname__ = state["qualname"]
    f.__doc__ = state["doc"]
    if state["dict"]:
        f.__dict__.update(state["dict"])
    if state["annotations"]:
        f.__annotations__ = state["annotations"]
    for c, (full, v) in zip(f.__closure__ or (), state["cells"]):
        if full:
            c.cell_contents = v


def _class(meta, name, bases, slots):
    ns = {"__module__": "__main__"}
    if slots is not None:
        ns["__slots__"] = slots
    return meta(name, bases, ns)


def _set_class(cls, d):
    for k, v in d.items():
        if k in ("__module__", "__doc__") or k == "__qualname__":
            continue
        try:
            setattr(cls, k, v)
        except (AttributeError, TypeError):
            pass
    if "__doc__" in d:
        try:
            cls.__doc__ = d["__doc__"]
        except (AttributeError, TypeError):
            pass


class _Unpickler(pickle.Unpickler):
    def __init__(self, f, main):
        super().__init__(f)
        self._main = main

    def persistent_load(self, pid):
        if pid == "main":
            return self._main
        if isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "module":
            __import__(pid[1])
            return sys.modules[pid[1]]
        raise pickle.UnpicklingError("unknown reference %r" % (pid,))


def _dumps(main, names):
    f = io.BytesIO()
    _Pickler(f, main).dump({n: main[n] for n in names})
    return f.getvalue()


def _kept(name, value):
    """Whether a global is the state's: not the interpreter's own names."""
    return not (name.startswith("__") and name.endswith("__"))


def dump(main, path, max_bytes):
    """Writes the state of namespace main to path (through path.tmp,
    renamed only when whole and at most max_bytes) and returns the report:
    {"kept": [...], "dropped": {name: reason}, "bytes": N, "saved": bool,
    "reason": why not saved}."""
    modules, names, dropped = {}, [], {}
    for name, value in list(main.items()):
        if not _kept(name, value):
            continue
        if isinstance(value, types.ModuleType):
            if value.__name__ == "__main__":
                dropped[name] = "module __main__: cannot be serialised"
            else:
                modules[name] = value.__name__
            continue
        names.append(name)
    # Together first; where that fails, each alone finds the ones that
    # cannot be pickled, and the rest go together again.
    chunks = []
    try:
        chunks.append(_dumps(main, names))
    except BaseException as e:
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        good = []
        for n in names:
            try:
                _dumps(main, [n])
                good.append(n)
            except BaseException as e1:
                if isinstance(e1, (KeyboardInterrupt, SystemExit)):
                    raise
                dropped[n] = _unserialisable(main[n], e1)
        try:
            chunks.append(_dumps(main, good))
        except BaseException:
            # Shared between names, then: each alone.
            for n in good:
                chunks.append(_dumps(main, [n]))
        names = good
    body = pickle.dumps({"modules": modules, "chunks": chunks}, protocol=_PROTOCOL)
    size = len(MAGIC) + len(body)
    report = {"kept": sorted(list(modules) + names), "dropped": dropped, "bytes": size, "saved": False}
    if size > max_bytes:
        report["reason"] = "state of %d bytes, more than sessions.state_max_bytes (%d): not kept, the previous one stays" % (size, max_bytes)
        return report
    report["saved"] = True
    if _same(path, body):
        # What was restored, unchanged: not written again, and agentrun
        # keeps the session's state as it is.
        report["unchanged"] = True
        return report
    report["saved"] = False
    d = os.path.dirname(path)
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    # Written aside and renamed into place, so that agentrun finds either
    # a whole state or none; no fsync: agentrun copies it out of the disk
    # once the run has ended.
    with open(tmp, "wb") as f:
        f.write(MAGIC)
        f.write(body)
    os.replace(tmp, path)
    report["saved"] = True
    return report


def _same(path, body):
    """Whether the state file at path holds exactly MAGIC and body."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size != len(MAGIC) + len(body) or f.read(len(MAGIC)) != MAGIC:
                return False
            view, at = memoryview(body), 0
            while at < len(body):
                chunk = f.read(1 << 20)
                if not chunk or view[at:at + len(chunk)] != chunk:
                    return False
                at += len(chunk)
            return True
    except OSError:
        return False


def load(main, path):
    """Restores the state at path into namespace main; returns {name:
    reason} of the names it could not restore. No file: nothing."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return {}
    if not data.startswith(MAGIC):
        return {"*": "the state was saved by another Python or agentrun (%r): not restored" % data[:40]}
    dropped = {}
    try:
        st = pickle.loads(data[len(MAGIC):])
        modules, chunks = st["modules"], st["chunks"]
    except Exception as e:
        return {"*": "cannot be restored: " + _reason(e)}
    for name, mod in modules.items():
        try:
            __import__(mod)
            main[name] = sys.modules[mod]
        except BaseException as e:
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            dropped[name] = "module %s: cannot be imported (%s)" % (mod, _reason(e))
    for chunk in chunks:
        try:
            main.update(_Unpickler(io.BytesIO(chunk), main).load())
        except BaseException as e:
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            dropped["*"] = "part of the state cannot be restored: " + _reason(e)
    return dropped


# Where a run's state report goes, which agentrun reads (internal/launcher,
# state.go).
REPORT = "/dev/agentrun-display/state"


def begin(main, keep, reset, limit, path):
    """A run's start, with agentrun's state request (agentrun_run's
    state_begin): the state at path removed (reset), or restored into
    namespace main (keep); returns what end needs."""
    dropped = {}
    if reset:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            dropped["*"] = "the state could not be removed: %s" % e
    elif keep:
        try:
            dropped = load(main, path)
        except BaseException as e:
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            dropped = {"*": "the state could not be restored: %s: %s" % (type(e).__name__, e)}
    return {"keep": keep, "limit": limit, "path": path, "dropped": dropped}


def end(st, main):
    """A run's end, where begin kept the state: the state of namespace
    main saved, and the report written where agentrun reads it; never
    fails the run."""
    try:
        rep = dump(main, st["path"], st["limit"])
        for name, why in st["dropped"].items():
            rep["dropped"].setdefault(name, why)
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            raise
        rep = {"kept": [], "dropped": dict(st["dropped"]), "bytes": 0, "saved": False,
               "reason": "the state could not be saved (%s: %s): the previous one stays" % (type(e).__name__, e)}
    try:
        import json

        data = json.dumps(rep, default=str).encode()
        fd = os.open(REPORT, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            while data:
                data = data[os.write(fd, data):]
        finally:
            os.close(fd)
    except BaseException:
        pass
