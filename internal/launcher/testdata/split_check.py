# Runs FILE through agentrun's run launcher as a cold run's start does
# (TestSplitSameAsProgram), on the host:
#
#     python3 -u split_check.py FILE ARG...
#
# with CHECK_RUN and CHECK_RUNLIB the launcher's files, CHECK_OUT a
# directory for what it shows (bundles, the display channel) and whether
# split() was taken (split: yes or no), and CHECK_MODE "split" (the
# launcher as it is) or "program" (split() answers None: program()'s way
# alone); with CHECK_TRACE set, a trace function is set before it runs.
import os
import sys

_env = os.environ
_run = type(sys)("agentrun_run")
_run.__file__ = _env["CHECK_RUN"]
with open(_env["CHECK_RUN"], "rb") as _f:
    exec(compile(_f.read(), _env["CHECK_RUN"], "exec", dont_inherit=True), _run.__dict__)
# The launcher's library, as agentrun_runlib.py with its channel in
# CHECK_OUT, which the launcher compiles from its file at its first need.
with open(_env["CHECK_RUNLIB"]) as _f:
    _lib = _f.read()
_channel = 'CHANNEL = "/dev/agentrun-display/bundles"\n'
assert _channel in _lib
_run.RUNLIB = os.path.join(_env["CHECK_OUT"], "agentrun_runlib.py")
with open(_run.RUNLIB, "w") as _f:
    _f.write(_lib.replace(_channel, "CHANNEL = %r\n" % os.path.join(_env["CHECK_OUT"], "bundles")))
_split = _run.split


def _recorded(source, path):
    code = _split(source, path) if _env["CHECK_MODE"] == "split" else None
    with open(os.path.join(_env["CHECK_OUT"], "split"), "w") as f:
        f.write("no" if code is None else "yes")
    return code


_run.split = _recorded
if _env.get("CHECK_TRACE"):
    sys.settrace(lambda frame, event, arg: None)  # split() must not take its place
del _f, _lib, _channel
_run.main(__file__, globals())
