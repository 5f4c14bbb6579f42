"""agentrun_tools: the tools of this run's tool servers, as Python functions.

agentrun brokers each call (spec section 13): the tool servers and their
credentials stay on the host, every call is ruled by the operator's config,
may be held for a human, and is recorded.

    import agentrun_tools
    agentrun_tools.list()                          # the tools this run may call
    agentrun_tools.call("github", "get_issue", owner="o", repo="r", issue_number=1)

    from agentrun_tools import github              # a server, by its name
    github.get_issue(owner="o", repo="r", issue_number=1)

Hyphens in server and tool names are written as underscores. A call returns
the tool's structured content when it has some, else the text of its one
text content, else its content list. A refusal, a failure and a tool's own
error (isError) raise ToolError.
"""

import json
import urllib.error
import urllib.request

URL = "http://tools.agentrun/v1"

# Direct to the broker, whatever proxy variables say: tools.agentrun is the
# run's gateway, answered by the run's proxy either way.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

__all__ = ["ToolError", "list", "call"]


class ToolError(Exception):
    """A tool call that was refused, failed, or answered with isError.

    result is the tool's result (content, structuredContent, isError) when
    the tool answered, else None.
    """

    def __init__(self, message, result=None):
        super().__init__(message)
        self.result = result


def _request(method, path, body=None, timeout=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(URL + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with _opener.open(req, timeout=timeout) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as e:
        try:
            msg = json.load(e).get("error") or str(e)
        except Exception:
            msg = str(e)
        raise ToolError(msg) from None
    except urllib.error.URLError as e:
        raise ToolError("the tool broker cannot be reached (does the task name tools?): %s" % e.reason) from None


_listed = None


def list():
    """The tools this run may call: dicts of server, name, description and
    input_schema."""
    global _listed
    if _listed is None:
        _listed = _request("GET", "/tools").get("tools") or []
    return [dict(t) for t in _listed]


def _key(name):
    return name.replace("-", "_")


def _real(server, tool):
    """The names as the servers write them, for names as Python writes them."""
    for t in list():
        if _key(t["server"]) == _key(server) and _key(t["name"]) == _key(tool):
            return t["server"], t["name"]
    return server, tool


def call(server, tool, /, **arguments):
    """Calls tool of server with arguments and returns its answer (see the
    module's doc)."""
    result = _request("POST", "/call", {"server": server, "tool": tool, "arguments": arguments})
    if result.get("isError"):
        raise ToolError(_text(result) or "tool %s of %s answered with an error" % (tool, server), result)
    if result.get("structuredContent") is not None:
        return result["structuredContent"]
    content = result.get("content") or []
    if len(content) == 1 and content[0].get("type") == "text":
        return content[0].get("text")
    return content


def _text(result):
    return "\n".join(c.get("text", "") for c in result.get("content") or [] if c.get("type") == "text")


class Server:
    """A tool server of the run: its tools are its attributes."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, tool):
        if tool.startswith("__"):
            raise AttributeError(tool)
        server, real = _real(self._name, tool)

        def tool_call(**arguments):
            return call(server, real, **arguments)

        tool_call.__name__ = tool
        for t in list():
            if t["server"] == server and t["name"] == real:
                tool_call.__doc__ = t.get("description")
        return tool_call

    def __dir__(self):
        return sorted(_key(t["name"]) for t in list() if _key(t["server"]) == _key(self._name))

    def __repr__(self):
        return "<agentrun tool server %s>" % self._name


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    for t in list():
        if _key(t["server"]) == name:
            return Server(t["server"])
    return Server(name)


def __dir__():
    return sorted(set(__all__) | {_key(t["server"]) for t in list()})
