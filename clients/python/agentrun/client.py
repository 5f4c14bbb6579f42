"""The client of agentrun serve's HTTP API (internal/server/openapi.json).

Standard library only; Python 3.9 or later. Every call is bounded by a
timeout; a refusal raises AgentrunError (Error) with the server's status,
the task field at fault and, for 429 and 503, when to try again. Nothing
is retried unless the client is asked to (retries=N). The names are the
TypeScript client's, snake_case (docs/clients.md).
"""

import base64
import http.client
import json
import os
import socket
import time
import urllib.parse
from types import TracebackType
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Type, TypedDict,
                    Union, cast)

from .types import (DecisionTaken, Event, ForkAnswer, Health, HeldRequest, Limits, ProcessEvent, ProcessInfo, Result,
                    SandboxFile, SandboxInfo, SessionFile, SessionInfo, TaskNetwork)

__all__ = ["Client", "Context", "Sessions", "Sandboxes", "Sandbox", "SandboxProcess", "SandboxFiles", "AgentrunError", "Error",
           "TransportError", "DEFAULT_ADDRESS", "Approval", "ProcessResult"]

DEFAULT_ADDRESS = "unix:///run/agentrun/agentrun.sock"

# Bounds on what is read from the server: a result (collected files
# included, base64) and one line of a stream.
_MAX_ANSWER = 256 << 20
_MAX_LINE = 64 << 20
# The longest Retry-After a retry waits.
_MAX_RETRY_WAIT = 30.0

_TASK_FIELDS = frozenset([
    "id", "session", "keep_workspace", "keep_state", "reset_state", "image", "language", "code", "command",
    "stdin", "files", "collect", "env", "limits", "network", "runtime", "tools",
])


class Approval(HeldRequest, total=False):
    """A request held for a decision, as Client.stream's on_approval gets
    it: the held request, and the run it is of."""

    run: str


class ProcessResult(TypedDict):
    """The outcome of a live sandbox's process (Sandbox.exec,
    SandboxProcess.wait): its output as text (bytes that are not UTF-8
    replaced) and its exit's fields; dropped_bytes counts output the
    sandbox did not keep."""

    pid: Optional[int]
    stdout: str
    stderr: str
    exit_code: Optional[int]
    signal: Optional[str]
    timed_out: bool
    duration_ms: Optional[int]
    dropped_bytes: int


class Error(Exception):
    """A refusal or failure of a call.

    status: the HTTP status (None when no answer came: see TransportError).
    field: the task field at fault, as task.json spells it ("limits.memory",
    "image", "session"), or None.
    message: what is wrong.
    retry_after: seconds after which to try again (429, 503), or None.
    result: the run's result when the server sent one (a run agentrun could
    not run: status 500, result["error"] says why), else None.
    """

    def __init__(self, message: str, status: Optional[int] = None, field: Optional[str] = None,
                 retry_after: Optional[float] = None, result: Optional[Result] = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.field = field
        self.retry_after = retry_after
        self.result = result

    def __str__(self) -> str:
        parts = []
        if self.status is not None:
            parts.append(str(self.status))
        if self.field:
            parts.append(self.field + ":")
        parts.append(self.message)
        return " ".join(parts)

    def __repr__(self) -> str:
        return "agentrun.Error(status=%r, field=%r, message=%r, retry_after=%r)" % (
            self.status, self.field, self.message, self.retry_after)


# The TypeScript client's name for Error.
AgentrunError = Error


class TransportError(Error):
    """No whole answer: the server could not be reached, did not answer
    within the timeout, or cut its answer (a stream without its result)."""


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a unix socket, as Host "agentrun": a name serve takes
    as its own there (it refuses a Host that is not one of its names)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("agentrun", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(self.timeout)
            s.connect(self._path)
        except BaseException:
            s.close()
            raise
        self.sock = s


def _task(fields: Mapping[str, Any]) -> Dict[str, Any]:
    """task.json from run()'s keywords. files values may be str (text),
    bytes (sent as base64) or a {"content"|"content_base64": ...} dict;
    timeout is limits.timeout ("5s", or seconds as a number)."""
    fields = dict(fields)
    task: Dict[str, Any] = {}
    timeout = fields.pop("timeout", None)
    unknown = sorted(set(fields) - _TASK_FIELDS)
    if unknown:
        raise TypeError("unknown task field(s): %s" % ", ".join(unknown))
    for k, v in fields.items():
        if v is not None:
            task[k] = v
    if "files" in task:
        files = {}
        for name, v in task["files"].items():
            if isinstance(v, str):
                v = {"content": v}
            elif isinstance(v, (bytes, bytearray, memoryview)):
                v = {"content_base64": base64.b64encode(bytes(v)).decode("ascii")}
            files[name] = v
        task["files"] = files
    if timeout is not None:
        if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
            timeout = "%gs" % timeout
        task["limits"] = dict(task.get("limits") or {}, timeout=timeout)
    return task


def _quote(path: str) -> str:
    """A session file's name as one path segment: slashes and dots escaped,
    so that no part of it is read as a dot segment before the server
    checks it."""
    return urllib.parse.quote(path, safe="").replace(".", "%2E")


class Client:
    """A client of agentrun serve.

    address: "unix:///path/to.sock", "http://host:port" or "https://...";
    by default $AGENTRUN_SERVER, else unix:///run/agentrun/agentrun.sock.
    token: the server's bearer token; by default $AGENTRUN_TOKEN.
    timeout: seconds for the connection and each read of a call; a run
    waits up to run_timeout for its answer, and a stream must end within
    it (request_timeout= on one call says otherwise).
    retries: times a run refused with 429 or 503 is sent again, after the
    server's Retry-After (at most 30 s); 0, the default: never.
    """

    def __init__(self, address: Optional[str] = None, token: Optional[str] = None, timeout: float = 30.0,
                 run_timeout: float = 600.0, retries: int = 0) -> None:
        address = address or os.environ.get("AGENTRUN_SERVER") or DEFAULT_ADDRESS
        self.token = token if token is not None else os.environ.get("AGENTRUN_TOKEN") or None
        self.timeout = timeout
        self.run_timeout = run_timeout
        self.retries = retries
        u = urllib.parse.urlsplit(address)
        self._unix: Optional[str] = None
        self._host: Optional[str] = None
        self._https = False
        self._prefix = ""
        if u.scheme == "unix":
            self._unix = u.path or u.netloc
        elif u.scheme in ("http", "https"):
            self._host, self._https = u.netloc, u.scheme == "https"
            self._prefix = u.path.rstrip("/")
        else:
            raise ValueError("address %r: want unix:///path, http://host:port or https://host:port" % address)
        self.address = address
        self.sessions = Sessions(self)
        self.sandboxes = Sandboxes(self)

    # --- runs ---

    def run(self, request_timeout: Optional[float] = None, **task: Any) -> Result:
        """Runs a task (task.json's fields as keywords) and returns its
        result as a dict: stdout, stderr, exit_code, timed_out, ... The
        program's own failure is a result; a task the server refuses, or
        one agentrun could not run (status 500, with .result), raises
        Error."""
        body = json.dumps(_task(task)).encode()
        status, headers, data = self._call("POST", "/v1/runs", body, "application/json",
                                           request_timeout or self.run_timeout, retry=True)
        res = _json(status, data)
        if status == 200:
            return cast(Result, res)
        raise _refusal(status, headers, res)

    def context(self, session_id: Optional[str] = None, tools: Optional[Sequence[str]] = None) -> "Context":
        """A notebook-like context: a kept session whose Python globals
        carry from one run to the next (keep_state), each run still a
        fresh sandbox. Without session_id it makes a session; close()
        (or leaving a with block) removes what it made. tools names the
        config's tool servers every run of the context may call (task.json's
        tools), unless a run names its own."""
        return Context(self, session_id, tools)

    def stream(self, on_approval: Optional[Callable[["Approval"], Optional[bool]]] = None,
               request_timeout: Optional[float] = None, **task: Any) -> Iterator[Event]:
        """Runs a task and yields its events as dicts as they come:
        {"event": "stdout"|"stderr", "data": ...}, {"event": "approval",
        "run": ..., "approval": {...}}, and last {"event": "result",
        "result": {...}}.

        on_approval(approval) is called with each request held for a
        decision (id, service, method, url, body_excerpt, body_cut when the
        excerpt is the body's start, and run), or tool call (kind "tool",
        service the tool server, tool, arguments as JSON text, run; method,
        url and body_excerpt empty); the program's words come escaped:
        True approves it, False denies it, None leaves it to another
        channel or the timeout. A stream cut before its result raises TransportError;
        a run agentrun could not run raises Error (status 500, .result)."""
        body = json.dumps(_task(task)).encode()
        limit = request_timeout or self.run_timeout
        conn, resp = self._open("POST", "/v1/runs?stream=1", body, "application/json", limit, retry=True)
        try:
            if resp.status != 200:
                data = _read(resp)
                raise _refusal(resp.status, resp.headers, _json(resp.status, data))
            for line in _ndjson(resp, limit, "the result"):
                ev = cast(Event, line)
                kind = ev.get("event")
                if kind == "approval" and on_approval is not None:
                    a = cast(Approval, dict(ev.get("approval") or {}, run=ev.get("run")))
                    ok = on_approval(a)
                    if ok is not None:
                        try:
                            self.approve(ev.get("run") or "", a.get("id") or "", bool(ok))
                        except Error as e:
                            # Too late: it timed out or its request ended,
                            # as the result's network.approvals will say.
                            if e.status != 404:
                                raise
                if kind == "result":
                    res = ev.get("result")
                    if res and res.get("error"):
                        raise Error(res["error"], status=500, result=res)
                    yield ev
                    return
                yield ev
            raise TransportError("stream ended before the result")
        finally:
            conn.close()

    def approve(self, run: str, approval_id: str, approve: bool, by: Optional[str] = None) -> DecisionTaken:
        """Decides a request of run held for approval (the approval
        event's run and approval["id"]); by, at most 64 bytes, names who
        decided in the result and the audit record ("operator (serve API:
        BY)")."""
        path = "/v1/runs/%s/approvals/%s" % (_quote(run), _quote(approval_id))
        decision: Dict[str, Any] = {"approve": bool(approve)}
        if by is not None:
            decision["by"] = by
        body = json.dumps(decision).encode()
        return cast(DecisionTaken, self._json_call("POST", path, body, "application/json"))

    def _events(self, method: str, path: str, body: Optional[bytes],
                request_timeout: Optional[float]) -> Iterator[ProcessEvent]:
        """The events of a process's NDJSON answer (POST …/processes,
        GET …/events), until its exit; a refusal raises Error."""
        limit = request_timeout or self.run_timeout
        conn, resp = self._open(method, path, body, "application/json" if body else None, limit)
        try:
            if resp.status != 200:
                data = _read(resp)
                raise _refusal(resp.status, resp.headers, _json(resp.status, data))
            for ev in _ndjson(resp, limit, "the process's exit"):
                yield cast(ProcessEvent, ev)
                if ev.get("event") == "exit":
                    return
        finally:
            conn.close()

    # --- the server ---

    def health(self) -> Health:
        """GET /healthz: runs going on and waiting, and the warm pool."""
        return cast(Health, self._json_call("GET", "/healthz"))

    def openapi(self) -> Dict[str, Any]:
        """The OpenAPI document of the server's API."""
        return cast(Dict[str, Any], self._json_call("GET", "/v1/openapi.json"))

    # --- plumbing ---

    def _json_call(self, method: str, path: str, body: Optional[bytes] = None, ctype: Optional[str] = None,
                   ok: Tuple[int, ...] = (200, 201)) -> Any:
        status, headers, data = self._call(method, path, body, ctype, self.timeout)
        if status == 204:
            return None
        res = _json(status, data)
        if status in ok:
            return res
        raise _refusal(status, headers, res)

    def _call(self, method: str, path: str, body: Optional[bytes], ctype: Optional[str], timeout: float,
              retry: bool = False) -> Tuple[int, http.client.HTTPMessage, bytes]:
        """Sends a request and reads its whole answer: (status, headers, body)."""
        conn, resp = self._open(method, path, body, ctype, timeout, retry)
        try:
            return resp.status, resp.headers, _read(resp)
        finally:
            conn.close()

    def _open(self, method: str, path: str, body: Optional[bytes], ctype: Optional[str], timeout: float,
              retry: bool = False) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Sends a request, retrying a 429 or 503 when asked; returns the
        connection and the answer, its body unread."""
        attempt = 0
        while True:
            conn = self._connect(timeout)
            try:
                headers = {"Accept": "application/json"}
                if self.token:
                    headers["Authorization"] = "Bearer " + self.token
                if ctype:
                    headers["Content-Type"] = ctype
                conn.request(method, self._prefix + path, body=body, headers=headers)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                raise TransportError("%s %s on %s: %s" % (method, path, self.address, _why(e))) from None
            wait = _retry_after(resp.headers)
            if retry and attempt < self.retries and resp.status in (429, 503) and wait is not None and wait <= _MAX_RETRY_WAIT:
                conn.close()
                attempt += 1
                time.sleep(wait)
                continue
            return conn, resp

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        if self._unix is not None:
            return _UnixConnection(self._unix, timeout)
        host = self._host or ""
        if self._https:
            return http.client.HTTPSConnection(host, timeout=timeout)
        return http.client.HTTPConnection(host, timeout=timeout)


class Context:
    """State kept between runs of one kept session (Client.context): each
    run starts with the globals the previous one left (values, functions,
    classes, imports), in a fresh sandbox.

        with c.context() as ctx:
            ctx.run("x = 1")
            ctx.run("x + 1")["value"]["text/plain"]   # "2"
    """

    def __init__(self, client: Client, session_id: Optional[str] = None, tools: Optional[Sequence[str]] = None) -> None:
        self._c = client
        self._made = session_id is None
        self.tools = list(tools) if tools else None
        self.id = client.sessions.create() if session_id is None else session_id

    def _with_tools(self, task: Dict[str, Any]) -> Dict[str, Any]:
        """task with the context's tools, unless it names its own."""
        if self.tools and task.get("tools") is None:
            task["tools"] = self.tools
        return task

    def run(self, code: str, **task: Any) -> Result:
        """Runs code (Python) with the context's state (and tools); the
        result as Client.run gives it, its "state" saying what was kept."""
        return self._c.run(code=code, session=self.id, keep_state=True, **self._with_tools(task))

    def stream(self, code: str, on_approval: Optional[Callable[["Approval"], Optional[bool]]] = None,
               **task: Any) -> Iterator[Event]:
        """Client.stream of code with the context's state (and tools)."""
        return self._c.stream(on_approval=on_approval, code=code, session=self.id, keep_state=True,
                              **self._with_tools(task))

    def reset(self) -> None:
        """Clears the state: the next run starts with no globals (the
        session's files stay)."""
        self._c.run(code="pass", session=self.id, reset_state=True)

    def fork(self, count: int) -> List["Context"]:
        """count new contexts (1 to 64), each a copy of this one's state and
        files, independent from then on."""
        return [Context(self._c, sid) for sid in self._c.sessions.fork(self.id, count)]

    def close(self) -> None:
        """Removes the session, its files and state."""
        self._c.sessions.delete(self.id)

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, kind: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        if self._made:
            self.close()


class Sessions:
    """Kept sessions: a /workspace that outlives a run (Client.sessions).
    A run uses one with session=ID, keep_workspace=True."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def create(self) -> str:
        """Makes a session and returns its id (a capability: keep it)."""
        return cast(str, self._c._json_call("POST", "/v1/sessions")["id"])

    # The name create had before it took the TypeScript client's.
    new = create

    def get(self, session_id: str) -> SessionInfo:
        """The session (created, last_used, max_bytes, busy, ...) and its files."""
        return cast(SessionInfo, self._c._json_call("GET", "/v1/sessions/" + _quote(session_id)))

    def files(self, session_id: str) -> List[SessionFile]:
        """The session's files: dicts of name, type, size, mtime."""
        return self.get(session_id)["files"] or []

    def read(self, session_id: str, path: str) -> bytes:
        """The bytes of the session's file path (relative to /workspace)."""
        status, headers, data = self._c._call("GET", self._path(session_id, path), None, None, self._c.timeout)
        if status == 200:
            return data
        raise _refusal(status, headers, _json(status, data))

    def write(self, session_id: str, path: str, data: Union[str, bytes, bytearray, memoryview]) -> None:
        """Writes data (bytes, or str as UTF-8) as the session's file path."""
        if isinstance(data, str):
            data = data.encode()
        self._c._json_call("PUT", self._path(session_id, path), bytes(data), "application/octet-stream")

    def delete(self, session_id: str) -> None:
        """Removes the session and its files."""
        self._c._json_call("DELETE", "/v1/sessions/" + _quote(session_id))

    def fork(self, session_id: str, count: int) -> List[str]:
        """Makes count new sessions (1 to 64), each a copy of the session's
        files (and state), independent from then on; returns their ids."""
        body = json.dumps({"count": count}).encode()
        res = cast(ForkAnswer, self._c._json_call("POST", "/v1/sessions/%s/fork" % _quote(session_id), body,
                                                  "application/json"))
        return [s["id"] for s in res["sessions"] or []]

    @staticmethod
    def _path(session_id: str, path: str) -> str:
        return "/v1/sessions/%s/files/%s" % (_quote(session_id), _quote(path))


def _duration(v: Union[str, float]) -> str:
    """A duration as the API takes it: "10m", or seconds as a number."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return "%gs" % v
    return v


def _process_request(cmd: Union[str, Sequence[str]], cwd: Optional[str], env: Optional[Mapping[str, str]], stdin: bool,
                     timeout: Optional[Union[str, float]]) -> bytes:
    """The body of POST …/processes: cmd a shell line (str) or an argv."""
    req: Dict[str, Any]
    if isinstance(cmd, str):
        req = {"cmd": cmd}
    else:
        req = {"command": list(cmd)}
    if cwd is not None:
        req["cwd"] = cwd
    if env:
        req["env"] = dict(env)
    if stdin:
        req["stdin"] = True
    if timeout is not None:
        req["timeout"] = _duration(timeout)
    return json.dumps(req).encode()


def _outcome(events: Iterable[ProcessEvent]) -> "ProcessResult":
    """A process's result from its events: stdout and stderr (text, bytes
    that are not UTF-8 replaced), and the exit's fields."""
    out = {"stdout": bytearray(), "stderr": bytearray()}
    pid: Optional[int] = None
    for ev in events:
        kind = ev.get("event")
        if kind == "start":
            pid = ev.get("pid")
        elif kind == "stdout" or kind == "stderr":
            b64 = ev.get("data_b64")
            out[kind] += base64.b64decode(b64) if b64 else (ev.get("data") or "").encode()
        elif kind == "exit":
            return {"pid": pid, "stdout": out["stdout"].decode("utf-8", "replace"),
                    "stderr": out["stderr"].decode("utf-8", "replace"), "exit_code": ev.get("exit_code"),
                    "signal": ev.get("signal"), "timed_out": bool(ev.get("timed_out")),
                    "duration_ms": ev.get("duration_ms"), "dropped_bytes": ev.get("dropped_bytes") or 0}
    raise TransportError("the process's stream ended before its exit")


class Sandboxes:
    """Live sandboxes (Client.sandboxes, docs/sandboxes.md): a sandbox
    whose processes outlive the call that started them, until it ends
    (its timeout, close(), or serve stopping)."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def create(self, image: Optional[str] = None, runtime: Optional[str] = None, limits: Optional[Limits] = None,
               network: Optional[TaskNetwork] = None, env: Optional[Mapping[str, str]] = None,
               timeout: Optional[Union[str, float]] = None, session: Optional[str] = None,
               tools: Optional[Sequence[str]] = None) -> "Sandbox":
        """Makes a live sandbox and returns its Sandbox. timeout is its
        lifetime ("10m", or seconds); session a kept session's id, whose
        files are its /workspace (held for its life, kept after it);
        tools the config's tool servers it may call; the others are a
        task's fields."""
        req = {"image": image, "runtime": runtime, "limits": limits, "network": network, "env": env,
               "timeout": _duration(timeout) if timeout is not None else None, "session": session,
               "tools": list(tools) if tools is not None else None}
        body = json.dumps({k: v for k, v in req.items() if v is not None}).encode()
        return Sandbox(self._c, self._c._json_call("POST", "/v1/sandboxes", body, "application/json"))

    def get(self, sandbox_id: str) -> "Sandbox":
        """The live sandbox sandbox_id (a capability), as a Sandbox."""
        return Sandbox(self._c, self._c._json_call("GET", "/v1/sandboxes/" + _quote(sandbox_id)))

    def list(self) -> List[SandboxInfo]:
        """The live sandboxes: dicts of id, expires_at, image, created."""
        return cast(List[SandboxInfo], self._c._json_call("GET", "/v1/sandboxes")["sandboxes"] or [])


class Sandbox:
    """A live sandbox: its processes (exec, spawn), files and ports. close()
    (or leaving a with block) ends it, killing everything in it.

        with c.sandboxes.create(timeout="10m") as sb:
            sb.exec("echo hi")["stdout"]          # "hi\n"
            p = sb.spawn(["cat"], stdin=True)
            p.write("x\n"); p.close_stdin(); p.wait()["stdout"]
    """

    def __init__(self, client: Client, info: SandboxInfo) -> None:
        self._c = client
        self.info = info
        self.id = info["id"]
        self.files = SandboxFiles(self)

    def _path(self, rest: str = "") -> str:
        return "/v1/sandboxes/" + _quote(self.id) + rest

    def get(self) -> SandboxInfo:
        """The sandbox as serve has it now (expires_at, ...); also kept as .info."""
        self.info = cast(SandboxInfo, self._c._json_call("GET", self._path()))
        return self.info

    def exec(self, cmd: Union[str, Sequence[str]], cwd: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
             timeout: Optional[Union[str, float]] = None, request_timeout: Optional[float] = None) -> "ProcessResult":
        """Runs cmd (a shell line, or an argv list) to its end and returns
        its result: stdout, stderr, exit_code, signal, timed_out,
        duration_ms, dropped_bytes, pid. timeout kills it after so long."""
        return _outcome(self.exec_stream(cmd, cwd, env, timeout, request_timeout))

    def exec_stream(self, cmd: Union[str, Sequence[str]], cwd: Optional[str] = None,
                    env: Optional[Mapping[str, str]] = None, timeout: Optional[Union[str, float]] = None,
                    request_timeout: Optional[float] = None) -> Iterator[ProcessEvent]:
        """Runs cmd and yields its events as they come: start (pid),
        stdout and stderr (data, or data_b64), and last exit."""
        body = _process_request(cmd, cwd, env, False, timeout)
        return self._c._events("POST", self._path("/processes"), body, request_timeout)

    def spawn(self, cmd: Union[str, Sequence[str]], cwd: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
              stdin: bool = False, timeout: Optional[Union[str, float]] = None) -> "SandboxProcess":
        """Starts cmd in the background and returns its SandboxProcess;
        stdin=True keeps its stdin open for write()."""
        body = _process_request(cmd, cwd, env, stdin, timeout)
        res = self._c._json_call("POST", self._path("/processes?wait=false"), body, "application/json")
        return SandboxProcess(self, res["pid"])

    def process(self, pid: int) -> "SandboxProcess":
        """The SandboxProcess of a process already started (its pid inside)."""
        return SandboxProcess(self, pid)

    def processes(self) -> List[ProcessInfo]:
        """Its processes, running and recently ended: dicts of pid, command,
        started, running, exit_code."""
        return cast(List[ProcessInfo], self._c._json_call("GET", self._path("/processes"))["processes"] or [])

    def set_timeout(self, timeout: Union[str, float]) -> SandboxInfo:
        """Makes it end timeout ("10m", or seconds) from now, within its
        max lifetime; returns the sandbox as serve has it then."""
        body = json.dumps({"timeout": _duration(timeout)}).encode()
        self.info = cast(SandboxInfo, self._c._json_call("POST", self._path("/timeout"), body, "application/json"))
        return self.info

    def port_url(self, port: int) -> str:
        """The URL through serve of TCP port inside it (HTTP and
        WebSocket), /v1/sandboxes/ID/ports/PORT/: with the API's token, or
        the sandbox's preview_token. On a unix socket, the path alone."""
        path = self._path("/ports/%d/" % int(port))
        if self._c._unix is not None:
            return path
        return "%s://%s%s%s" % ("https" if self._c._https else "http", self._c._host, self._c._prefix, path)

    def close(self) -> None:
        """Ends it: every process killed, everything torn down. One that
        had ended already is no error."""
        try:
            self._c._json_call("DELETE", self._path())
        except Error as e:
            if e.status != 404:
                raise

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, kind: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()


class SandboxProcess:
    """A process of a live sandbox (Sandbox.spawn, Sandbox.process)."""

    def __init__(self, sandbox: Sandbox, pid: int) -> None:
        self.sandbox = sandbox
        self.pid = pid

    def _path(self, rest: str) -> str:
        return self.sandbox._path("/processes/%d%s" % (int(self.pid), rest))

    def write(self, data: Union[str, bytes, bytearray, memoryview], close: bool = False) -> None:
        """Writes data (str, or bytes) to its stdin, at most 1 MiB a
        call; close=True closes its stdin after."""
        req: Dict[str, Any] = {"close": bool(close)}
        if isinstance(data, str):
            req["data"] = data
        else:
            req["data_b64"] = base64.b64encode(bytes(data)).decode("ascii")
        self.sandbox._c._json_call("POST", self._path("/stdin"), json.dumps(req).encode(), "application/json")

    def close_stdin(self) -> None:
        """Closes its stdin: the end of its input."""
        self.write("", close=True)

    def signal(self, signal: str = "SIGTERM") -> None:
        """Sends it signal ("SIGINT", "TERM", ...)."""
        body = json.dumps({"signal": signal}).encode()
        self.sandbox._c._json_call("POST", self._path("/signal"), body, "application/json")

    def events(self, request_timeout: Optional[float] = None) -> Iterator[ProcessEvent]:
        """Attaches: yields the kept tail of its events, then those to
        come, until its exit."""
        return self.sandbox._c._events("GET", self._path("/events"), None, request_timeout)

    def wait(self, request_timeout: Optional[float] = None) -> "ProcessResult":
        """Waits for its end and returns its result as Sandbox.exec does
        (stdout and stderr as far as the sandbox kept them)."""
        return _outcome(self.events(request_timeout))


class SandboxFiles:
    """The files of a live sandbox's /workspace (Sandbox.files): names
    relative to it, or absolute in it; never through a link."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def _path(self, name: str, query: str = "") -> str:
        return self._sb._path("/files/" + _quote(name) + query)

    def read(self, path: str) -> bytes:
        """The bytes of the file, at most 16 MiB."""
        c = self._sb._c
        status, headers, data = c._call("GET", self._path(path), None, None, c.timeout)
        if status == 200:
            return data
        raise _refusal(status, headers, _json(status, data))

    def write(self, path: str, data: Union[str, bytes, bytearray, memoryview]) -> None:
        """Writes data (bytes, or str as UTF-8) as the file, at most 16 MiB."""
        if isinstance(data, str):
            data = data.encode()
        self._sb._c._json_call("PUT", self._path(path), bytes(data), "application/octet-stream")

    def list(self, path: str = "") -> List[SandboxFile]:
        """The directory's entries (/workspace's by default): dicts of name, type, size, mode, mtime."""
        return cast(List[SandboxFile], self._sb._c._json_call("GET", self._path(path, "?list=1")) or [])

    def remove(self, path: str) -> None:
        """Removes the file (or empty directory)."""
        self._sb._c._json_call("DELETE", self._path(path))


def _ndjson(resp: http.client.HTTPResponse, limit: float, what: str) -> Iterator[Dict[str, Any]]:
    """The events of an NDJSON answer as dicts, each line at most
    _MAX_LINE bytes, until it ends; all of it within limit seconds. A
    line cut short raises TransportError naming what it was cut before."""
    deadline = time.monotonic() + limit
    while True:
        if time.monotonic() > deadline:
            raise TransportError("stream not ended within %g s" % limit)
        try:
            line = resp.readline(_MAX_LINE + 1)
        except (OSError, http.client.HTTPException) as e:
            raise TransportError("stream cut before %s: %s" % (what, _why(e))) from None
        if not line:
            return
        if len(line) > _MAX_LINE or not line.endswith(b"\n"):
            raise TransportError("stream cut before %s: a line of %d bytes without its end" % (what, len(line)))
        try:
            ev = json.loads(line)
        except ValueError:
            raise TransportError("stream line is not JSON: %.100r" % line) from None
        yield ev


def _read(resp: http.client.HTTPResponse) -> bytes:
    """The whole body of resp, at most _MAX_ANSWER bytes."""
    if resp.length is not None and resp.length > _MAX_ANSWER:
        raise TransportError("answer of %d bytes, more than %d" % (resp.length, _MAX_ANSWER))
    try:
        # With a length, read() raises when less comes; a chunked answer
        # raises when cut inside its chunks or before its last.
        data = resp.read() if resp.length is not None else resp.read(_MAX_ANSWER + 1)
    except (OSError, http.client.HTTPException) as e:
        raise TransportError("answer cut: %s" % _why(e)) from None
    if len(data) > _MAX_ANSWER:
        raise TransportError("answer larger than %d bytes" % _MAX_ANSWER)
    return data


def _json(status: int, data: bytes) -> Any:
    try:
        return json.loads(data) if data else {}
    except ValueError:
        raise Error("answer is not JSON: %.200r" % data, status=status) from None


def _refusal(status: int, headers: http.client.HTTPMessage, body: Any) -> Error:
    """The Error of a refusal: the API's {"error", "field"}, or a result
    with its error (500: agentrun could not run the task)."""
    if not isinstance(body, dict):
        body = {}
    if "exit_code" in body and "id" in body:
        return Error(body.get("error") or "run failed", status=status, field=None,
                     retry_after=_retry_after(headers), result=body)
    return Error(body.get("error") or "HTTP %d" % status, status=status, field=body.get("field"),
                 retry_after=_retry_after(headers))


def _retry_after(headers: http.client.HTTPMessage) -> Optional[float]:
    v = headers.get("Retry-After")
    try:
        return float(v) if v is not None else None
    except ValueError:
        return None


def _why(e: BaseException) -> str:
    if isinstance(e, socket.timeout):
        return "timed out"
    return str(e) or type(e).__name__
