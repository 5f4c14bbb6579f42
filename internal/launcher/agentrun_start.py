# agentrun's run launcher's start (internal/runner/launchcode.go): the
# program of a cold or pooled run of Python code,
#
#     <the language's argv, with this file before FILE:> START FILE ...
#
# It runs the run launcher (run.py, mounted read-only at LAUNCHER) in this
# file's namespace, as if it were this file: from its bytecode when agentrun
# mounted it at CODE (made by this image's own interpreter, in a sandbox of
# its own), or else compiled from its source. The interpreter compiles its
# program's file at each start and never caches it; this file is small,
# and the launcher's bytecode loads in a tenth of its compile's time.
#
# CODE holds the interpreter's magic number and then the launcher's code,
# marshalled. Bytecode another interpreter made (another version's magic),
# or that does not load as code, is not used: the source is.
import sys

LAUNCHER = "/dev/agentrun-run.py"
CODE = "/dev/agentrun-run.pyc"


def _launcher():
    try:
        with open(CODE, "rb") as f:
            data = f.read()
        if data[:4] == sys.modules["_frozen_importlib_external"].MAGIC_NUMBER:
            import marshal

            code = marshal.loads(data[4:])
            if type(code) is type(_launcher.__code__):
                return code
    except Exception:
        pass
    with open(LAUNCHER, "rb") as f:
        return compile(f.read(), LAUNCHER, "exec", dont_inherit=True)


exec(_launcher())
