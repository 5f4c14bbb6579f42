"""agentrun: run an agent's code in a single-use, locked-down Linux sandbox,
through agentrun serve's API. Standard library only (Python 3.9+).

    import agentrun
    c = agentrun.Client("unix:///run/agentrun/agentrun.sock")  # or "http://host:port", token="..."
    r = c.run(code="print(1)", language="python", timeout="5s")
    r["stdout"], r["exit_code"]
    for ev in c.stream(code="...", on_approval=lambda a: ask_human(a)):
        ...
    sid = c.sessions.create(); c.sessions.write(sid, "in/a.txt", b"...")
    c.run(code="...", session=sid, keep_workspace=True)
    c.run(code="6 * 7")["value"]                     # {"text/plain": "42"}, and "display": figures
    with c.context() as ctx:                         # globals kept between runs
        ctx.run("x = 1"); ctx.run("x + 1"); a, b = ctx.fork(2)
    with c.sandboxes.create(timeout="10m") as sb:    # a live sandbox
        sb.exec("echo hi")["stdout"]
        p = sb.spawn(["cat"], stdin=True); p.write("x\n", close=True); p.wait()
        sb.files.write("a.txt", "..."); sb.port_url(3000)

Refusals raise agentrun.AgentrunError, also named agentrun.Error (status,
field, message, retry_after). The names are the TypeScript client's, in
snake_case. Results are typed dicts (agentrun.Result, agentrun.Event, ...:
agentrun.types, from serve's OpenAPI document); the package is typed
(PEP 561).
"""

from .client import (DEFAULT_ADDRESS, AgentrunError, Approval, Client, Context, Error, ProcessResult, Sandbox, Sandboxes,
                     SandboxFiles, SandboxProcess, Sessions, TransportError)
from .types import (Bundle, Event, ForkAnswer, Health, HeldRequest, Limits, ProcessEvent, ProcessInfo, Result,
                    SandboxFile, SandboxInfo, SandboxRequest, SessionFile, SessionInfo, State, Task, TaskFile,
                    TaskNetwork)

__version__ = "0.1.0"
__all__ = ["Client", "Context", "Sessions", "Sandboxes", "Sandbox", "SandboxProcess", "SandboxFiles", "AgentrunError",
           "Error", "TransportError", "DEFAULT_ADDRESS", "Approval", "ProcessResult", "Bundle", "Event", "ForkAnswer",
           "Health", "HeldRequest", "Limits", "ProcessEvent", "ProcessInfo", "Result", "SandboxFile", "SandboxInfo",
           "SandboxRequest", "SessionFile", "SessionInfo", "State", "Task", "TaskFile", "TaskNetwork"]
