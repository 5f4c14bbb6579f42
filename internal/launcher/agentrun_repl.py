# agentrun's REPL launcher (internal/launcher; the host's side is
# internal/e2b/interp): a code interpreter's context, a Python interpreter
# kept alive in a live sandbox for its life, as a Jupyter kernel is. It is
# agentrun's own file, mounted read-only at REPL
# (/dev/agentrun-python/agentrun_repl.py) in every live sandbox beside the
# run launcher (RUN, agentrun_run.py) and its library, and is started as a
# process exec'd into the sandbox, under all of its restrictions:
#
#     python3 REPL
#
# Its protocol runs over the descriptors it was started with, which it
# keeps for itself: requests come as JSON lines on its stdin, one per cell,
#
#     {"cell": N, "code": "...", "env": {"NAME": "VALUE"}}
#
# and its frames go as JSON lines (ASCII: no newline inside one) to its
# stdout:
#
#     {"t": "ready"}                          once, when it can take a cell
#     {"t": "stdout"|"stderr", "cell": N, "text": "..."}
#     {"t": "result", "cell": N, "main": bool, "bundle": {MIME: "..."}}
#     {"t": "error", "cell": N, "name": "...", "value": "...", "traceback": "..."}
#     {"t": "done", "cell": N, "count": N}
#
# The program's own descriptors 1 and 2 are pipes whose every byte the
# launcher relays as stdout and stderr frames (its subprocesses' too, which
# inherit them), and its descriptor 0 is /dev/null: nothing the code prints
# is read as a frame. The code runs in one namespace, __main__, kept from
# cell to cell; its last expression's value, display(obj) and matplotlib's
# figures (shown, or still open at the cell's end) come as results, as the
# run launcher shows them in a run (spec §12). Output that comes between
# cells (a thread's) is framed with cell 0, which agentrun drops.
import os
import sys

RUN = "/dev/agentrun-python/agentrun_run.py"

_ONLY_AST = 0x400  # ast.PyCF_ONLY_AST


def main():
    import json
    import threading
    import select
    import codecs
    import linecache
    import traceback
    import fcntl
    import termios
    import struct
    import time

    dumps, loads = json.dumps, json.loads
    # The protocol's descriptors, kept from the program (os.dup's copies
    # are not inherited by what it starts).
    out_fd, in_fd = os.dup(1), os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    pipes = {}
    for fd, name in ((1, "stdout"), (2, "stderr")):
        r, w = os.pipe()
        os.dup2(w, fd)
        os.close(w)
        os.set_blocking(r, False)
        pipes[name] = (r, codecs.getincrementaldecoder("utf-8")("replace"))
    for f in (sys.stdout, sys.stderr):
        try:
            f.reconfigure(line_buffering=True)
        except Exception:
            pass

    lock = threading.RLock()
    cell = [0]

    def emit(frame):
        data = ("\n" + dumps(frame, ensure_ascii=True) + "\n").encode("ascii")
        with lock:
            while data:
                data = data[os.write(out_fd, data):]

    def relay(name, final=False):
        """Relays what the pipe of name holds now; with lock held."""
        r, dec = pipes[name]
        while True:
            try:
                data = os.read(r, 65536)
            except BlockingIOError:
                return
            if not data:
                return
            text = dec.decode(data, final)
            if text:
                emit({"t": name, "cell": cell[0], "text": text})

    def relayer():
        rs = [p[0] for p in pipes.values()]
        names = {p[0]: n for n, p in pipes.items()}
        while True:
            ready, _, _ = select.select(rs, [], [])
            # A moment for the rest of a print (its text and its end are
            # two writes) to come: one frame, as a notebook's stream.
            time.sleep(0.002)
            with lock:
                for r in ready:
                    relay(names[r])

    def pending(r):
        buf = fcntl.ioctl(r, termios.FIONREAD, b"\0\0\0\0")
        return struct.unpack("i", buf)[0]

    def drain():
        """Relays every byte written to the program's stdout and stderr
        so far: what the cell printed comes before its end."""
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:
                pass
        with lock:
            for name in pipes:
                while pending(pipes[name][0]):
                    relay(name)

    t = threading.Thread(target=relayer, name="agentrun-relay", daemon=True)
    t.start()

    # The run launcher: display(), values, figures (its library's _write
    # sends each bundle as a result frame here, not to a run's file).
    sys.path[0] = ""
    run = _load(RUN)
    run.launchers.append(globals())
    run.start()
    rest = run.lib()

    def write(kind, bundle):
        drain()
        emit({"t": "result", "cell": cell[0], "main": kind == "value", "bundle": bundle})

    if rest is not None:
        rest._write = write
    own = sys.modules["__main__"]
    ns_main = type(sys)("__main__")
    ns_main.__builtins__ = own.__builtins__
    ns_main.__annotations__ = {}
    sys.modules["__main__"] = ns_main
    ns = ns_main.__dict__

    def error(e):
        tb = e.__traceback__
        if rest is not None:
            tb = rest._own(tb)
        # The cell's own frames: those of this launcher are left out.
        while tb is not None and tb.tb_frame.f_globals is not ns and tb.tb_frame.f_code.co_filename in (__file__, RUN):
            tb = tb.tb_next
        try:
            text = "".join(traceback.format_exception(type(e), e, tb))
        except Exception:
            text = ""
        try:
            value = str(e)
        except Exception:
            value = "<str() failed>"
        emit({"t": "error", "cell": cell[0], "name": type(e).__name__, "value": value, "traceback": text})

    def figures():
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is not None and rest is not None:
            try:
                rest.show_figures(pyplot, True)
            except Exception:
                pass
        if rest is not None:
            del rest._shown[:]

    count = 0
    emit({"t": "ready"})
    infile = os.fdopen(in_fd, "rb", buffering=0)
    buf = b""
    while True:
        try:
            while b"\n" not in buf:
                chunk = infile.read(1 << 16)
                if not chunk:
                    return
                buf += chunk
            line, buf = buf.split(b"\n", 1)
            req = loads(line)
            n, code, env = int(req["cell"]), str(req["code"]), dict(req.get("env") or {})
        except KeyboardInterrupt:
            continue
        count += 1
        cell[0] = n
        saved = {k: os.environ.get(k) for k in env}
        try:
            os.environ.update({str(k): str(v) for k, v in env.items()})
            name = "<cell %d>" % count
            linecache.cache[name] = (len(code), None, code.splitlines(True), name)
            tree = run.program(compile(code, name, "exec", _ONLY_AST))
            exec(compile(tree, name, "exec"), ns)
        except BaseException as e:  # SystemExit and KeyboardInterrupt too
            try:
                drain()
                error(e)
            except BaseException:
                pass
            del e
        try:
            figures()
        except BaseException:
            pass
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        # The cell's end goes out whatever interrupts it (a SIGINT that
        # came late): a frame cut short is alone on its line.
        while True:
            try:
                drain()
                with lock:
                    emit({"t": "done", "cell": n, "count": count})
                    cell[0] = 0
                break
            except KeyboardInterrupt:
                continue


def _load(path):
    mod = type(sys)("agentrun_run")
    mod.__file__ = path
    with open(path, "rb") as f:
        exec(compile(f.read(), path, "exec"), mod.__dict__)
    return mod


if __name__ == "__main__":
    main()
