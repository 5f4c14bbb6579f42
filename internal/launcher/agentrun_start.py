# agentrun's run launcher's start (internal/launcher, code.go): the
# program of a cold or pooled run of Python code,
#
#     <the language's argv, with this file before FILE:> START FILE ...
#
# It loads the run launcher (agentrun_run.py, mounted read-only at RUN)
# as the module agentrun_run, from its bytecode when agentrun mounted it
# at RUN_CODE (made by this image's own interpreter, in a sandbox of its
# own), or else compiled from its source, and runs FILE through it
# (agentrun_run.main). The interpreter compiles its program's file at each
# start and never caches it; this file is small, and the launcher's
# bytecode loads in a tenth of its compile's time.
#
# RUN_CODE holds the interpreter's magic number and then the launcher's
# code, marshalled. Bytecode another interpreter made (another version's
# magic), or that does not load as code, is not used: the source is.
#
# The module is made here, not imported: an import would look through
# sys.path (which an interpreter option or PYTHON* variable of the task's
# changes) and leave the module in sys.modules, where the task's code sees
# it.
import sys

RUN = "/dev/agentrun-python/agentrun_run.py"
RUN_CODE = "/dev/agentrun-python/agentrun_run.pyc"


def _code():
    try:
        with open(RUN_CODE, "rb") as f:
            data = f.read()
        if data[:4] == sys.modules["_frozen_importlib_external"].MAGIC_NUMBER:
            import marshal

            code = marshal.loads(data[4:])
            if type(code) is type(_code.__code__):
                return code
    except Exception:
        pass
    with open(RUN, "rb") as f:
        return compile(f.read(), RUN, "exec", dont_inherit=True)


_run = type(sys)("agentrun_run")
_run.__file__ = RUN
exec(_code(), _run.__dict__)
_run.main(__file__, globals())
