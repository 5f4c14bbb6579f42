"""Tests of the agentrun client, standard library only.

ClientTest needs nothing but the client: its servers are sockets of the
test's own that answer as a broken or refusing server would (a stream cut
mid-way, an answer shorter than it said, no answer at all, a 429).
ServeTest runs against a real agentrun serve, named by
AGENTRUN_TEST_ADDRESS (and AGENTRUN_TEST_TOKEN), as
test/integration/TestPythonClient starts it: server.max_concurrent 2,
server.queue 0, server.quota.runs_per_minute 3, and a service whose
POSTs to AGENTRUN_TEST_SERVICE_URL are held for approval.
"""

import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
import typing
import unittest
import uuid

import agentrun

ADDRESS = os.environ.get("AGENTRUN_TEST_ADDRESS")
TOKEN = os.environ.get("AGENTRUN_TEST_TOKEN") or None
SERVICE_URL = os.environ.get("AGENTRUN_TEST_SERVICE_URL")


class FakeServer:
    """A TCP listener on loopback whose connections get answer(conn)."""

    def __init__(self, answer):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.address = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.requests = []
        self._answer = answer
        self._t = threading.Thread(target=self._serve, daemon=True)
        self._t.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(10)
                head = b""
                while b"\r\n\r\n" not in head:
                    b = conn.recv(65536)
                    if not b:
                        break
                    head += b
                self.requests.append(head)
                self._answer(conn)

    def close(self):
        self.sock.close()


def chunk(b):
    return b"%x\r\n%s\r\n" % (len(b), b)


class ClientTest(unittest.TestCase):
    def serve(self, answer):
        s = FakeServer(answer)
        self.addCleanup(s.close)
        return s

    def test_task_keywords(self):
        t = agentrun.client._task({"code": "x", "files": {"a": "text", "b": b"\x00\xff", "c": {"content": "y"}},
                                   "timeout": 2.5, "limits": {"memory": "64m"}})
        self.assertEqual(t, {"code": "x", "files": {"a": {"content": "text"}, "b": {"content_base64": "AP8="},
                                                     "c": {"content": "y"}},
                             "limits": {"memory": "64m", "timeout": "2.5s"}})
        with self.assertRaises(TypeError):
            agentrun.client._task({"code": "x", "cod": "y"})
        self.assertEqual(agentrun.client._task({"code": "x", "tools": ["github"]}), {"code": "x", "tools": ["github"]})

    def test_task_fields_are_the_documents(self):
        # The keywords run() takes are the task's properties in serve's
        # OpenAPI document (when the client runs from a checkout).
        doc = os.path.join(os.path.dirname(__file__), "..", "..", "..", "internal", "server", "openapi.json")
        if not os.path.exists(doc):
            self.skipTest("not in a checkout: no %s" % doc)
        with open(doc) as f:
            task = json.load(f)["components"]["schemas"]["Task"]["properties"]
        self.assertEqual(sorted(agentrun.client._TASK_FIELDS), sorted(task))

    def test_names_are_the_typescript_clients(self):
        # Each class the TypeScript client exports, and each public method
        # of its classes, is here by the same name (camelCase as
        # snake_case), when the client runs from a checkout.
        src = os.path.join(os.path.dirname(__file__), "..", "..", "typescript", "src", "index.ts")
        if not os.path.exists(src):
            self.skipTest("not in a checkout: no %s" % src)
        with open(src) as f:
            text = f.read()
        classes = re.findall(r"^export class (\w+)[^\n]*\{\n(.*?)^\}", text, re.M | re.S)
        self.assertIn("Sessions", [name for name, _ in classes])
        for name, body in classes:
            self.assertTrue(hasattr(agentrun, name), "agentrun has no %s" % name)
            methods = re.findall(r"^  (/\*\*[^\n]*@internal[^\n]*\*/\n  )?(?:async )?\*?(\w+)\(", body, re.M)
            for internal, method in methods:
                if internal or method == "constructor":
                    continue
                snake = re.sub(r"[A-Z]", lambda m: "_" + m.group(0).lower(), method)
                self.assertTrue(hasattr(getattr(agentrun, name), snake), "agentrun.%s has no %s" % (name, snake))

    def test_types_are_the_typescript_clients(self):
        # Each type the TypeScript client exports from the OpenAPI
        # document is agentrun's by the same name, with the same fields;
        # and so is ProcessResult, the clients' own (from a checkout).
        src = os.path.join(os.path.dirname(__file__), "..", "..", "typescript", "src", "index.ts")
        doc = os.path.join(os.path.dirname(__file__), "..", "..", "..", "internal", "server", "openapi.json")
        if not os.path.exists(src) or not os.path.exists(doc):
            self.skipTest("not in a checkout: no %s or %s" % (src, doc))
        with open(src) as f:
            text = f.read()
        with open(doc) as f:
            schemas = json.load(f)["components"]["schemas"]
        exported = re.findall(r'^export type (\w+) = Schemas\["(\w+)"\];', text, re.M)
        self.assertIn(("SandboxInfo", "Sandbox"), exported)
        for name, schema in exported:
            self.assertIn(name, agentrun.__all__)
            self.assertEqual(sorted(typing.get_type_hints(getattr(agentrun, name))), sorted(schemas[schema]["properties"]), name)
        body = re.search(r"^export interface ProcessResult \{\n(.*?)^\}", text, re.M | re.S).group(1)
        self.assertEqual(sorted(typing.get_type_hints(agentrun.ProcessResult)), sorted(re.findall(r"^  (\w+)\??:", body, re.M)))

    def test_context_tools(self):
        # A context's tools go with each of its runs, unless a run names
        # its own.
        sent = []

        class Runs:
            def run(self, **task):
                sent.append(task)

            def stream(self, **task):
                sent.append(task)

        ctx = agentrun.client.Context(Runs(), "ss-" + "0" * 32, tools=["github"])
        ctx.run("x = 1")
        ctx.run("x", tools=["docs"])
        ctx.stream("x")
        self.assertEqual([t.get("tools") for t in sent], [["github"], ["docs"], ["github"]])
        self.assertTrue(all(t["session"] == ctx.id and t["keep_state"] for t in sent), sent)
        agentrun.client.Context(Runs(), "ss-" + "0" * 32).run("y")
        self.assertNotIn("tools", sent[-1])

    def test_addresses(self):
        with self.assertRaises(ValueError):
            agentrun.Client("ftp://x")
        c = agentrun.Client("unix:///nonexistent/agentrun.sock", timeout=2)
        with self.assertRaises(agentrun.TransportError) as cm:
            c.health()
        self.assertIsNone(cm.exception.status)

    def test_unix_socket_host(self):
        # serve takes only its own names as Host; on the unix socket the
        # client's is "agentrun".
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        path = os.path.join(d, "a.sock")
        ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(ls.close)
        ls.bind(path)
        ls.listen(1)
        heads = []

        def serve():
            conn, _ = ls.accept()
            with conn:
                conn.settimeout(10)
                head = b""
                while b"\r\n\r\n" not in head:
                    b = conn.recv(65536)
                    if not b:
                        break
                    head += b
                heads.append(head)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        self.assertEqual(agentrun.Client("unix://" + path, timeout=5).health(), {})
        t.join(10)
        hosts = [l for l in heads[0].split(b"\r\n") if l.lower().startswith(b"host:")]
        self.assertEqual(hosts, [b"Host: agentrun"])

    def test_file_names_are_one_segment(self):
        self.assertEqual(agentrun.Sessions._path("ss-1", "../a/b.txt"),
                         "/v1/sessions/ss-1/files/%2E%2E%2Fa%2Fb%2Etxt")

    def test_stream_cut_raises(self):
        line = json.dumps({"event": "stdout", "data": "a\n"}).encode() + b"\n"

        def answer(conn):
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n" + chunk(line) + chunk(b'{"event": "stdout", "da'))

        s = self.serve(answer)
        got = []
        with self.assertRaises(agentrun.TransportError):
            for ev in agentrun.Client(s.address, timeout=5).stream(code="x"):
                got.append(ev)
        self.assertEqual(got, [{"event": "stdout", "data": "a\n"}])

    def test_stream_without_result_raises(self):
        def answer(conn):
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n" + chunk(b'{"event": "stdout", "data": "a"}\n') + chunk(b""))

        s = self.serve(answer)
        with self.assertRaises(agentrun.TransportError):
            list(agentrun.Client(s.address, timeout=5).stream(code="x"))

    def test_stream_tool_approval(self):
        # A held tool call comes to on_approval with its kind, tool
        # server, tool and arguments (the program's, escaped), and the
        # callback's True approves it through the API.
        held = {"id": "ap-t", "kind": "tool", "service": "github", "tool": "create_issue\\n",
                "arguments": '{"title":"\\u202ex"}', "method": "", "url": "", "body_excerpt": ""}
        stream = (json.dumps({"event": "approval", "run": "ar-1", "approval": held}).encode() + b"\n" +
                  json.dumps({"event": "result", "result": {"id": "ar-1", "error": ""}}).encode() + b"\n")

        def answer(conn):
            if s.requests[-1].startswith(b"POST /v1/runs?stream=1 "):
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n" + chunk(stream) + chunk(b""))
                return
            body = b'{"run": "ar-1", "id": "ap-t", "approved": true}'
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

        s = self.serve(answer)
        asked = []

        def decide(a):
            asked.append(a)
            return a.get("kind") == "tool"

        events = list(agentrun.Client(s.address, timeout=5).stream(code="x", on_approval=decide))
        self.assertEqual(asked, [dict(held, run="ar-1")])
        self.assertEqual(events[-1]["event"], "result")
        self.assertTrue(s.requests[-1].startswith(b"POST /v1/runs/ar-1/approvals/ap-t "), s.requests[-1])

    def test_short_answer_raises(self):
        def answer(conn):
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"id\": ")

        s = self.serve(answer)
        with self.assertRaises(agentrun.TransportError):
            agentrun.Client(s.address, timeout=5).run(code="x")

    def test_no_answer_times_out(self):
        def answer(conn):
            time.sleep(3)

        s = self.serve(answer)
        c = agentrun.Client(s.address, timeout=0.5, run_timeout=0.5)
        start = time.monotonic()
        with self.assertRaises(agentrun.TransportError) as cm:
            c.health()
        with self.assertRaises(agentrun.TransportError):
            c.run(code="x")
        self.assertIn("timed out", cm.exception.message)
        self.assertLess(time.monotonic() - start, 10)

    def test_retries_only_when_asked(self):
        answers = []

        def answer(conn):
            answers.append(1)
            if len(answers) < 3:  # two refusals, then the run
                body = b'{"error": "session \\"a\\" is over its quota of 1 runs per minute"}'
                conn.sendall(b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
                             b"Retry-After: 1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            else:
                body = json.dumps({"id": "ar-1", "exit_code": 0, "stdout": "ok\n", "error": ""}).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

        s = self.serve(answer)
        with self.assertRaises(agentrun.Error) as cm:
            agentrun.Client(s.address).run(code="x")
        e = cm.exception
        self.assertEqual((e.status, e.retry_after, e.field), (429, 1.0, None))
        self.assertIn("quota", e.message)
        self.assertEqual(agentrun.Client(s.address, retries=1).run(code="x")["stdout"], "ok\n")
        self.assertEqual(len(answers), 3)


@unittest.skipUnless(ADDRESS, "no agentrun serve (AGENTRUN_TEST_ADDRESS)")
class ServeTest(unittest.TestCase):
    def setUp(self):
        self.c = agentrun.Client(ADDRESS, token=TOKEN, timeout=30, run_timeout=120)

    def session(self):
        """A session name of this test's own: the quota counts per session."""
        return "py-" + uuid.uuid4().hex[:12]

    def refused(self, status, fn, *args, **kw):
        with self.assertRaises(agentrun.Error) as cm:
            fn(*args, **kw)
        e = cm.exception
        self.assertEqual(e.status, status, repr(e))
        self.assertTrue(e.message, repr(e))
        return e

    def test_health(self):
        h = self.c.health()
        self.assertEqual(h["status"], "ok")
        self.assertEqual(self.c.openapi()["openapi"], "3.1.0")

    def test_run(self):
        r = self.c.run(code="import sys\nprint(sys.stdin.read(), open('a.csv').read(), len(open('b.bin', 'rb').read()))",
                       language="python", files={"a.csv": "x,y", "b.bin": b"\x00\xff\x00"}, stdin="in",
                       timeout="10s", session=self.session())
        self.assertEqual((r["stdout"], r["exit_code"], r["error"]), ("in x,y 3\n", 0, ""))
        # The program's own failure is a result, not an Error.
        r = self.c.run(code="import sys; sys.exit(3)", session=self.session())
        self.assertEqual(r["exit_code"], 3)
        r = self.c.run(code="while True: pass", timeout=0.5, session=self.session())
        self.assertTrue(r["timed_out"])

    def test_stream(self):
        events = list(self.c.stream(code="import sys, time\nprint('a', flush=True)\ntime.sleep(0.3)\n"
                                         "print('b', file=sys.stderr)", session=self.session()))
        kinds = [ev["event"] for ev in events]
        self.assertEqual(kinds[-1], "result", kinds)
        out = "".join(ev["data"] for ev in events if ev["event"] == "stdout")
        err = "".join(ev["data"] for ev in events if ev["event"] == "stderr")
        self.assertEqual((out, err), ("a\n", "b\n"))
        self.assertEqual(events[-1]["result"]["stdout"], "a\n")

    @unittest.skipUnless(SERVICE_URL, "no service held for approval (AGENTRUN_TEST_SERVICE_URL)")
    def test_approvals(self):
        code = (
            "import urllib.request, urllib.error\n"
            "for i in (1, 2):\n"
            "    req = urllib.request.Request(%r + str(i), data=b'body', method='POST')\n"
            "    try:\n"
            "        r = urllib.request.urlopen(req, timeout=30)\n"
            "        print(r.status, r.read().decode())\n"
            "    except urllib.error.HTTPError as e:\n"
            "        print(e.code, e.read().decode().strip())\n"
        ) % SERVICE_URL
        asked = []

        def decide(a):
            asked.append(a)
            return len(asked) == 1  # the first approved, the second denied

        events = list(self.c.stream(code=code, network={"services": ["api"]}, timeout="30s",
                                    session=self.session(), on_approval=decide))
        self.assertEqual(len(asked), 2, asked)
        a = asked[0]
        self.assertEqual((a["method"], a["url"], a["body_excerpt"]), ("POST", SERVICE_URL + "1", "body"))
        self.assertTrue(a["run"].startswith("ar-") and a["id"], a)
        res = events[-1]["result"]
        lines = res["stdout"].splitlines()
        self.assertTrue(lines[0].startswith("200 "), lines)
        self.assertEqual(lines[1], "403 agentrun: denied by the operator")
        self.assertEqual([(x["approved"], x["by"]) for x in res["network"]["approvals"]],
                         [(True, "operator (serve API)"), (False, "operator (serve API)")])
        # Decided already: nothing waits.
        e = self.refused(404, self.c.approve, a["run"], a["id"], True)
        self.assertIsNone(e.field)

    def test_sessions(self):
        s = self.c.sessions
        sid = s.new()
        self.assertTrue(sid.startswith("ss-"), sid)
        try:
            s.write(sid, "in/a.txt", b"from the client")
            self.assertEqual(s.read(sid, "in/a.txt"), b"from the client")
            r = self.c.run(code="print(open('in/a.txt').read()); open('out.txt', 'w').write('from the run')",
                           session=sid, keep_workspace=True)
            self.assertEqual(r["stdout"], "from the client\n")
            names = {f["name"]: f["type"] for f in s.files(sid)}
            self.assertEqual((names.get("in"), names.get("in/a.txt"), names.get("out.txt")), ("dir", "file", "file"))
            self.assertEqual(s.read(sid, "out.txt"), b"from the run")
            self.assertEqual(s.get(sid)["id"], sid)
            self.refused(400, s.read, sid, "../etc/passwd")
            self.refused(400, s.read, sid, "missing.txt")
            copies = s.fork(sid, 2)
            try:
                self.assertEqual(len(set(copies) | {sid}), 3, copies)
                for c in copies:
                    self.assertEqual(s.read(c, "in/a.txt"), b"from the client")
                    self.assertEqual(s.read(c, "out.txt"), b"from the run")
                # Independent from then on: a copy's run changes only that copy.
                r = self.c.run(code="open('out.txt', 'w').write('copy 0')", session=copies[0], keep_workspace=True)
                self.assertEqual(r["exit_code"], 0, r)
                self.assertEqual(s.read(copies[0], "out.txt"), b"copy 0")
                self.assertEqual(s.read(copies[1], "out.txt"), b"from the run")
                self.assertEqual(s.read(sid, "out.txt"), b"from the run")
                e = self.refused(400, s.fork, sid, 65)
                self.assertEqual(e.field, "count")
                self.refused(400, s.fork, sid, 0)
            finally:
                for c in copies:
                    s.delete(c)
        finally:
            s.delete(sid)
        self.refused(404, s.fork, sid, 1)
        self.refused(404, s.read, sid, "in/a.txt")
        self.refused(404, s.files, sid)
        self.refused(404, s.delete, sid)
        e = self.refused(404, self.c.run, code="print(1)", session=sid, keep_workspace=True)
        self.assertEqual(e.field, "session")

    def test_context(self):
        # At most 3 runs a session here (the quota): the forks run the rest.
        with self.c.context() as ctx:
            self.assertTrue(ctx.id.startswith("ss-"), ctx.id)
            r = ctx.run("x = 1\ndef f(v): return v + x")
            self.assertTrue(r["state"]["saved"], r)
            self.assertIn("f", r["state"]["kept"])
            self.assertEqual(ctx.run("f(x)")["value"]["text/plain"], "2")
            forks = ctx.fork(2)
            try:
                forks[0].run("x = 10")
                self.assertEqual(forks[0].run("f(x)")["value"]["text/plain"], "20")
                self.assertEqual(ctx.run("f(x)")["value"]["text/plain"], "2")
                forks[1].reset()
                self.assertEqual(forks[1].run("print('x' in globals())")["stdout"], "False\n")
            finally:
                for f in forks:
                    f.close()
        self.refused(404, self.c.sessions.get, ctx.id)

    def test_values(self):
        # A final expression's value and what display() shows, in the
        # result and, streamed, as display events as they come.
        code = "display('first')\nprint('out')\n6 * 7"
        r = self.c.run(code=code, session=self.session())
        self.assertEqual((r["stdout"], r["value"], r["display"]), ("out\n", {"text/plain": "42"}, [{"text/plain": "'first'"}]))
        events = list(self.c.stream(code=code, session=self.session()))
        self.assertEqual([ev.get("display") for ev in events if ev["event"] == "display"], [{"text/plain": "'first'"}])
        self.assertEqual("".join(ev.get("data", "") for ev in events if ev["event"] == "stdout"), "out\n")
        self.assertEqual(events[-1]["event"], "result")
        self.assertEqual(events[-1]["result"]["value"], {"text/plain": "42"})

    def test_refusals(self):
        e = self.refused(400, self.c.run, code="print(1)", limits={"memory": "lots"}, session=self.session())
        self.assertEqual(e.field, "limits.memory")
        e = self.refused(403, self.c.run, code="print(1)", timeout="1h", session=self.session())
        self.assertEqual(e.field, "limits.timeout")
        e = self.refused(400, lambda: list(self.c.stream(code="print(1)", limits={"pids": -1})))
        self.assertEqual(e.field, "limits.pids")
        # agentrun could not run it: 500, with the result.
        e = self.refused(500, self.c.run, command=["/no/such/program"], session=self.session())
        self.assertTrue(e.result["id"].startswith("ar-") and e.result["error"], e.result)
        e = self.refused(500, lambda: list(self.c.stream(command=["/no/such/program"], session=self.session())))
        self.assertTrue(e.result["error"])

    def test_session_busy(self):
        sid = self.c.sessions.new()
        self.addCleanup(self.c.sessions.delete, sid)
        started = threading.Event()
        events = []

        def slow():
            # Streamed: its first line says the program runs, so the run
            # holds the session (asking with a listing would take it).
            for ev in self.c.stream(code="import time; print('holding', flush=True); time.sleep(3)",
                                    session=sid, keep_workspace=True):
                events.append(ev)
                started.set()

        t = threading.Thread(target=slow)
        t.start()
        try:
            self.assertTrue(started.wait(30), "the run never started")
            e = self.refused(409, self.c.run, code="print(1)", session=sid, keep_workspace=True)
            self.assertEqual(e.field, "session")
            self.assertIn("session busy", e.message)
            self.refused(409, self.c.sessions.write, sid, "a.txt", "x")
            self.refused(409, self.c.sessions.files, sid)
        finally:
            t.join()
        self.assertEqual(events[-1]["event"], "result")

    def test_quota(self):
        session = self.session()
        for _ in range(3):
            self.c.run(code="print(1)", session=session)
        e = self.refused(429, self.c.run, code="print(1)", session=session)
        self.assertIn("quota", e.message)
        self.assertTrue(e.retry_after and e.retry_after > 0, repr(e))

    def wait_idle(self):
        """Waits for runs an earlier test left going (a held request's, a
        stream's) to end: the busy test counts every run on the server."""
        deadline = time.monotonic() + 30
        while self.c.health()["running"] > 0:
            self.assertLess(time.monotonic(), deadline, "an earlier test's run never ended")
            time.sleep(0.05)

    def test_busy_and_retries(self):
        self.wait_idle()
        done = []
        slow = [threading.Thread(target=lambda: done.append(self.c.run(code="import time; time.sleep(3)",
                                                                        session=self.session())))
                for _ in range(2)]
        for t in slow:
            t.start()
        try:
            deadline = time.monotonic() + 20
            while self.c.health()["running"] < 2:
                self.assertLess(time.monotonic(), deadline, "the slow runs never started")
                time.sleep(0.05)
            e = self.refused(503, self.c.run, code="print(1)", session=self.session())
            self.assertEqual(e.retry_after, 1.0)
            # Asked to, the client waits out the Retry-After and runs.
            r = agentrun.Client(ADDRESS, token=TOKEN, retries=20).run(code="print('after')", session=self.session())
            self.assertEqual(r["stdout"], "after\n")
        finally:
            for t in slow:
                t.join()
        self.assertEqual(len(done), 2)

    def test_sandbox(self):
        # A live sandbox: exec to its end, a process spawned and fed,
        # files both ways, its timeout, its port's URL; closed, it is
        # gone.
        with self.c.sandboxes.create(timeout="2m") as sb:
            self.assertRegex(sb.id, r"^sb-[0-9a-f]{32}$")
            self.assertIn(sb.id, [x["id"] for x in self.c.sandboxes.list()])
            r = sb.exec("echo hi; echo err >&2; exit 3")
            self.assertEqual((r["stdout"], r["stderr"], r["exit_code"]), ("hi\n", "err\n", 3))
            self.assertEqual(sb.exec(["printf", "%s", "a b"])["stdout"], "a b")
            kinds = [ev["event"] for ev in sb.exec_stream("echo x")]
            self.assertEqual((kinds[0], kinds[-1]), ("start", "exit"))

            p = sb.spawn("cat; echo end", stdin=True)
            self.assertIn(p.pid, [x["pid"] for x in sb.processes()])
            p.write("one\n")
            p.write(b"two\n", close=True)
            r = p.wait()
            self.assertEqual((r["stdout"], r["exit_code"]), ("one\ntwo\nend\n", 0))
            slow = sb.spawn(["sleep", "600"])
            slow.signal("SIGKILL")
            self.assertEqual(slow.wait()["signal"], "SIGKILL")

            sb.files.write("d/in.bin", b"\x00\xffdata")
            self.assertEqual(sb.exec("cat d/in.bin | od -An -c | tr -s ' '")["stdout"].split(), ["\\0", "377", "d", "a", "t", "a"])
            sb.exec("echo made > out.txt")
            self.assertEqual(sb.files.read("out.txt"), b"made\n")
            self.assertEqual(sorted(f["name"] for f in sb.files.list()), ["d", "out.txt"])
            self.assertEqual([f["name"] for f in sb.files.list("d")], ["in.bin"])
            sb.files.remove("out.txt")
            self.refused(404, sb.files.read, "out.txt")

            before = sb.info["expires_at"]
            self.assertNotEqual(sb.set_timeout(90)["expires_at"], before)
            self.assertTrue(sb.port_url(3000).endswith("/v1/sandboxes/%s/ports/3000/" % sb.id), sb.port_url(3000))
            self.assertEqual(self.c.sandboxes.get(sb.id).id, sb.id)
        self.assertNotIn(sb.id, [x["id"] for x in self.c.sandboxes.list()])
        self.refused(404, self.c.sandboxes.get, sb.id)
        sb.close()  # again: no error

    def test_sandbox_session(self):
        # A kept session as a live sandbox's /workspace: its files there,
        # held while it lives, kept after it.
        sid = self.c.sessions.new()
        self.addCleanup(self.c.sessions.delete, sid)
        self.c.sessions.write(sid, "before.txt", "old")
        with self.c.sandboxes.create(session=sid) as sb:
            self.assertEqual(sb.exec("cat before.txt; echo kept > after.txt")["stdout"], "old")
            self.refused(409, self.c.sessions.files, sid)
        self.assertEqual(self.c.sessions.read(sid, "after.txt"), b"kept\n")

    @unittest.skipUnless(TOKEN, "no token on this server")
    def test_wrong_token(self):
        c = agentrun.Client(ADDRESS, token="wrong")
        self.refused(401, c.health)
        self.refused(401, c.run, code="print(1)")


if __name__ == "__main__":
    unittest.main()
