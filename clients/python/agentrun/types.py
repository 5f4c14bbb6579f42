"""The types of serve's API: a TypedDict for each object of its OpenAPI
document (internal/server/openapi.json), as agentrun's answers come.

Written by gen_types.py from the document: do not edit; run
`python3 clients/python/gen_types.py` after the document changes.
"""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, TypedDict

__all__ = [
    "Allowed", "ApprovalRecord", "ApprovalsPage", "Bundle", "Collect",
    "CollectedFile", "Decision", "DecisionTaken", "Denied", "Duration",
    "ErrorBody", "Event", "Failed", "ForkAnswer", "ForkRequest",
    "ForkedSession", "Health", "HeldRequest", "JSONRPCMessage", "Limits",
    "Network", "NewSession", "PageDecided", "PageHeld", "PoolHealth",
    "ProcessEvent", "ProcessInfo", "ProcessRequest", "ProcessStarted",
    "Result", "SandboxFile", "SandboxInfo", "SandboxRequest",
    "ServiceRequest", "SessionFile", "SessionInfo", "Size", "State",
    "StdinRequest", "TTYSize", "Task", "TaskFile", "TaskNetwork",
    "ToolCall", "Tools", "WebhookHold"
]


# A MIME bundle: MIME type to data, among text/plain, text/html,
# text/markdown, text/latex, image/svg+xml, application/json (as JSON text),
# image/png and image/jpeg (as base64).
Bundle = Dict[str, str]

# A Go duration greater than zero: `5s`, `1m30s`, `500ms` (units ns, us, ms,
# s, m, h).
Duration = str

# A byte size: a number with an optional binary unit, case-insensitive (k,
# m, g, t = 1024^n; `b`, `i`, `ib` may follow): `65536`, `256m`, `1.5g`,
# `64MiB`.
Size = str


class Allowed(TypedDict):
    """The connections to one allowed host and port."""

    host: str
    port: int
    bytes_in: int
    bytes_out: int
    conns: int


class _ApprovalRecordRequired(TypedDict):
    id: str
    service: str
    method: str
    url: str
    approved: bool
    by: str


class ApprovalRecord(_ApprovalRecordRequired, total=False):
    """One decision on a request held for approval, and who or what made it
    (`operator (serve API)`, `timeout`, `no way to ask`, `request
    abandoned`)."""

    taken: bool


class ApprovalsPage(TypedDict):
    """The body of GET /ui/approvals.json."""

    held: Optional[List[PageHeld]]
    recent: Optional[List[PageDecided]]


class _CollectRequired(TypedDict):
    unmatched: Optional[List[str]]


class Collect(_CollectRequired, total=False):
    """The patterns of `collect` that matched nothing, and the bound that
    stopped the walk early."""

    cut: str


class _CollectedFileRequired(TypedDict):
    size: int


class CollectedFile(_CollectedFileRequired, total=False):
    """A collected file; `error` says why a matching path was not returned."""

    name_base64: str
    content_base64: str
    truncated: bool
    error: str


class _DecisionRequired(TypedDict):
    approve: bool


class Decision(_DecisionRequired, total=False):
    by: str


class DecisionTaken(TypedDict):
    run: str
    id: str
    approved: bool


class Denied(TypedDict):
    """One distinct refusal and why (DNS refusals have port 53)."""

    host: str
    port: int
    reason: str
    count: int


class _ErrorBodyRequired(TypedDict):
    error: str


class ErrorBody(_ErrorBodyRequired, total=False):
    """The body of every refusal."""

    field: str


class _EventRequired(TypedDict):
    event: Literal["stdout", "stderr", "approval", "display", "result"]


class Event(_EventRequired, total=False):
    """One line of a streamed answer: `stdout` and `stderr` with `data` as the
    program writes (cut only between UTF-8 characters; with `data_base64`
    too when the bytes are not UTF-8), `approval` with `run` and `approval`
    for a request held for a decision, `display` with `display`, a bundle of
    the result's display, each sent as the program shows it (so before the
    output it writes after), and `result`, last, with `result`."""

    data: str
    data_base64: str
    result: Result
    run: str
    approval: HeldRequest
    display: Bundle


class Failed(TypedDict):
    """One distinct failure to reach an allowed destination and why."""

    host: str
    port: int
    reason: str
    count: int


class ForkAnswer(TypedDict):
    sessions: Optional[List[ForkedSession]]
    copy: Literal["reflink", "copy"]


class ForkRequest(TypedDict):
    """How many copies to make."""

    count: int


class ForkedSession(TypedDict):
    id: str


class _HealthRequired(TypedDict):
    status: Literal["ok", "degraded"]
    running: int
    queued: int


class Health(_HealthRequired, total=False):
    pool: PoolHealth


class _HeldRequestRequired(TypedDict):
    id: str
    service: str
    method: str
    url: str
    body_excerpt: str


class HeldRequest(_HeldRequestRequired, total=False):
    """A request to a service, or a tool call (`kind` `tool`), held for a
    decision. What the program controls is its text, escaped: `method`,
    `url` and `body_excerpt` of a request, `tool` and `arguments` of a tool
    call (whose `service` is the tool server, and `method`, `url` and
    `body_excerpt` empty). Every character that is not visible on its own
    (controls; format characters such as bidirectional and zero-width ones;
    variation selectors; Hangul fillers; private-use and unassigned code
    points; spaces but U+0020; a combining mark with nothing visible under
    it) and bytes that are not UTF-8 come escaped (`\\n`, `\\x1b`,
    `\\u202e`, `\\ufe0f`). A tool call, or a request body read as JSON, with
    a key twice in an object is refused, never held."""

    body_cut: bool
    kind: Literal["tool"]
    tool: str
    arguments: str


class JSONRPCMessage(TypedDict):
    """A JSON-RPC 2.0 message of the MCP specification."""

    jsonrpc: Any


class Limits(TypedDict, total=False):
    """Resource limits. Each is at most the config's `policy`: a task asking
    for more is refused (403), never clamped. Absent ones are the config's
    `limits`."""

    timeout: Duration
    memory: Size
    cpus: float
    pids: int
    output_bytes: int
    tmp_size: Size
    workspace_size: Size
    net_bytes: Size
    net_connections: int


class _NetworkRequired(TypedDict):
    allowed: Optional[List[Allowed]]
    denied: Optional[List[Denied]]
    failed: Optional[List[Failed]]


class Network(_NetworkRequired, total=False):
    """The run's egress decisions, as agentrun's proxy and DNS server recorded
    them."""

    requests: List[ServiceRequest]
    approvals: List[ApprovalRecord]
    requests_dropped: int
    none: bool
    note: str


class NewSession(TypedDict):
    id: str


class _PageDecidedRequired(TypedDict):
    run: str
    id: str
    service: str
    method: str
    url: str
    body_excerpt: str
    body_cut: bool
    session: str
    expires_at: str
    approved: bool
    by: str
    at: str


class PageDecided(_PageDecidedRequired, total=False):
    """A recent decision on the page."""

    kind: Literal["tool"]
    tool: str
    arguments: str


class _PageHeldRequired(TypedDict):
    run: str
    id: str
    service: str
    method: str
    url: str
    body_excerpt: str
    body_cut: bool
    session: str
    expires_at: str
    left_ms: int


class PageHeld(_PageHeldRequired, total=False):
    """A held request on the page, with the milliseconds it has left."""

    kind: Literal["tool"]
    tool: str
    arguments: str


class _PoolHealthRequired(TypedDict):
    ready: Optional[Dict[str, int]]
    hits: int
    misses: int


class PoolHealth(_PoolHealthRequired, total=False):
    """The warm pool: sandboxes ready by image, takes that found one and that
    did not."""

    last_error: str
    errors: Dict[str, str]
    warm: Dict[str, str]


class _ProcessEventRequired(TypedDict):
    event: Literal["start", "stdout", "stderr", "pty", "exit"]


class ProcessEvent(_ProcessEventRequired, total=False):
    pid: int
    data: str
    data_b64: str
    exit_code: int
    signal: str
    timed_out: bool
    duration_ms: int
    dropped_bytes: int


class _ProcessInfoRequired(TypedDict):
    pid: int
    command: Optional[List[str]]
    started: str
    running: bool


class ProcessInfo(_ProcessInfoRequired, total=False):
    tty: bool
    exit_code: int


class ProcessRequest(TypedDict, total=False):
    command: List[str]
    cmd: str
    cwd: str
    env: Dict[str, str]
    stdin: bool
    tty: TTYSize
    timeout: Duration


class ProcessStarted(TypedDict):
    pid: int


class _ResultRequired(TypedDict):
    id: str
    session: str
    exit_code: int
    signal: str
    timed_out: bool
    oom_killed: bool
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    stdout_bytes: int
    stderr_bytes: int
    duration_ms: int
    cpu_ms: int
    memory_peak_bytes: int
    image: str
    image_digest: str
    runtime: str
    network: Network
    files: Optional[Dict[str, CollectedFile]]
    error: str


class Result(_ResultRequired, total=False):
    """The outcome of one run."""

    stdout_base64: str
    stderr_base64: str
    collect: Collect
    value: Bundle
    display: List[Bundle]
    display_dropped: int
    state: State
    tools: Tools


class _SandboxFileRequired(TypedDict):
    name: str
    path: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: str
    mtime: str


class SandboxFile(_SandboxFileRequired, total=False):
    symlink_target: str


class _SandboxInfoRequired(TypedDict):
    id: str
    expires_at: str
    image: str
    created: str


class SandboxInfo(_SandboxInfoRequired, total=False):
    preview_token: str


class SandboxRequest(TypedDict, total=False):
    """A live sandbox: a task's fields but its program."""

    image: str
    runtime: Literal["libcontainer", "runsc", ""]
    limits: Limits
    network: TaskNetwork
    env: Dict[str, str]
    tools: List[str]
    session: str
    timeout: Duration


class _ServiceRequestRequired(TypedDict):
    service: str
    method: str
    path: str
    allowed: bool


class ServiceRequest(_ServiceRequestRequired, total=False):
    """One request to a service: what was asked, how it was decided, the
    headers injected (names only) and the upstream's status (absent when not
    sent or not answered)."""

    reason: str
    approval: str
    injected: List[str]
    status: int


class SessionFile(TypedDict):
    name: str
    type: Literal["file", "dir", "symlink", "fifo", "socket", "device", "other"]
    size: int
    mtime: str


class SessionInfo(TypedDict):
    id: str
    created: str
    last_used: str
    max_bytes: int
    disk_bytes: int
    busy: bool
    files: Optional[List[SessionFile]]
    truncated: bool


class _StateRequired(TypedDict):
    kept: Optional[List[str]]
    dropped: Optional[Dict[str, str]]
    bytes: int
    saved: bool


class State(_StateRequired, total=False):
    """A stateful run's report on the state it left (the launcher's, inside the
    sandbox: the program's words)."""

    reason: str


class StdinRequest(TypedDict, total=False):
    data: str
    data_b64: str
    close: bool


class TTYSize(TypedDict):
    rows: int
    cols: int


class Task(TypedDict, total=False):
    """task.json. Every field but `code` or `command` is optional; defaults
    come from the config. Unknown fields, wrong types, bad sizes or
    durations, and path tricks are refused (400) naming the field."""

    id: str
    session: str
    keep_workspace: bool
    keep_state: bool
    reset_state: bool
    image: str
    language: str
    code: str
    command: Optional[List[str]]
    stdin: str
    files: Optional[Dict[str, TaskFile]]
    collect: Optional[List[str]]
    env: Optional[Dict[str, str]]
    limits: Limits
    network: TaskNetwork
    tools: Optional[List[str]]
    runtime: Literal["", "libcontainer", "runsc"]


class TaskFile(TypedDict, total=False):
    """An input file: exactly one of `content` (text) and `content_base64`."""

    content: str
    content_base64: str


class TaskNetwork(TypedDict, total=False):
    """Egress. Empty or absent: no network at all."""

    allow: Optional[List[str]]
    services: Optional[List[str]]


class _ToolCallRequired(TypedDict):
    server: str
    tool: str
    allowed: bool
    duration_ms: int
    is_error: bool
    arguments_sha256: str


class ToolCall(_ToolCallRequired, total=False):
    """One call the program made through the broker: never its arguments or
    result, only the SHA-256 of the arguments as sent."""

    reason: str
    approval: str
    by: str


class _ToolsRequired(TypedDict):
    calls: Optional[List[ToolCall]]


class Tools(_ToolsRequired, total=False):
    """The run's calls to tool servers, present when the task names any
    (docs/tools.md)."""

    dropped: int


class _WebhookHoldRequired(TypedDict):
    run: str
    id: str
    service: str
    method: str
    url: str
    body_excerpt: str
    body_cut: bool
    session: str
    expires_at: str


class WebhookHold(_WebhookHoldRequired, total=False):
    """A held request or tool call as the webhook announces it; `method`, `url`
    and `body_excerpt` (a request), `tool` and `arguments` (a tool call,
    `kind` `tool`, its `service` the tool server) are the program's,
    escaped."""

    kind: Literal["tool"]
    tool: str
    arguments: str
