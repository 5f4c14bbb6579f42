# Checks agentrun_state.py on the host's python3 (TestStateModule): a state
# of every kind of global round-trips, what cannot is named, the cap holds.
import importlib.util
import os
import sys
import tempfile
spec = importlib.util.spec_from_file_location("agentrun_state", sys.argv[1])
m = importlib.util.module_from_spec(spec); sys.modules["agentrun_state"] = m; spec.loader.exec_module(m)
path = os.path.join(tempfile.mkdtemp(), "state")
# call 1
g1 = {"__name__": "__main__", "__builtins__": __builtins__}
exec(compile('''
import json as js
import collections
x = 41
data = {"a": [1, 2, 3]}
alias = data
def add(a, b=1): return a + b + x
square = lambda v: v * v
def counter():
    n = 0
    def inc():
        nonlocal n
        n += 1
        return n
    return inc
c = counter(); c(); c()
class P:
    k = 3
    def __init__(self, v): self.v = v
    def twice(self): return P(self.v * 2)
    def __repr__(self): return "P(%d)" % self.v
class Q(P):
    def twice(self): return super().twice()
p = P(5)
q = Q(7)
fh = open("/etc/hostname")
import threading
lock = threading.Lock()
gen = (i for i in range(3))
dq = collections.deque([1,2])
''', "<c1>", "exec"), g1)
r = m.dump(g1, path, 1 << 20)
print(r)
assert r["saved"] and {"fh", "gen", "lock"} <= set(r["dropped"]), r
assert "js" in r["kept"] and "add" in r["kept"]
g2 = {"__name__": "__main__", "__builtins__": __builtins__}
print("load:", m.load(g2, path))
exec(compile('''
assert add(1) == 43, add(1)
assert square(4) == 16
assert c() == 3
assert js.dumps([1]) == "[1]"
assert p.twice().v == 10 and isinstance(p.twice(), P)
assert q.twice().v == 14
alias["a"].append(4)
assert data["a"] == [1,2,3,4], "shared"
assert "fh" not in globals() and "gen" not in globals() and "lock" not in globals()
assert list(dq) == [1,2]
print("call 2 ok", p, P.k)
''', "<c2>", "exec"), g2)
# An unchanged state is not written again.
m.dump(g2, path, 1 << 20)
ino = os.stat(path).st_ino
g3 = {"__name__": "__main__", "__builtins__": __builtins__}
m.load(g3, path)
r3 = m.dump(g3, path, 1 << 20)
assert r3["saved"] and r3.get("unchanged") and os.stat(path).st_ino == ino, "an unchanged state was written again"
r = m.dump(g2, path, 100)
assert not r["saved"] and "reason" in r, r
assert os.path.getsize(path) > 100, "the cap replaced the previous state"
# Another Python's state is not restored, and says why.
with open(path, "r+b") as f:
    f.write(b"agentrun-state 1 2.7.0\n")
assert "*" in m.load({}, path)
print("ok")
