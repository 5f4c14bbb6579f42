"""agentrun: run an agent's code in a single-use, locked-down Linux sandbox,
through agentrun serve's API. Standard library only (Python 3.9+).

    import agentrun
    c = agentrun.Client("unix:///run/agentrun/agentrun.sock")  # or "http://host:port", token="..."
    r = c.run(code="print(1)", language="python", timeout="5s")
    r["stdout"], r["exit_code"]
    for ev in c.stream(code="...", on_approval=lambda a: ask_human(a)):
        ...
    sid = c.sessions.new(); c.sessions.write(sid, "in/a.txt", b"...")
    c.run(code="...", session=sid, keep_workspace=True)

Refusals raise agentrun.Error (status, field, message, retry_after).
"""

from .client import DEFAULT_ADDRESS, Client, Context, Error, Sessions, TransportError

__version__ = "0.1.0"
__all__ = ["Client", "Context", "Sessions", "Error", "TransportError", "DEFAULT_ADDRESS"]
