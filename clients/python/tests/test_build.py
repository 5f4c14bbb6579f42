"""Tests of the package itself, standard library only: its build backend
(build_backend.py: pip's only way to build it, with nothing from the
network), its types (agentrun/types.py, generated from serve's OpenAPI
document) and its annotations (PEP 561: py.typed, every public function
typed)."""

import base64
import csv
import hashlib
import inspect
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import typing
import unittest
import zipfile

import agentrun

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, HERE)
import build_backend  # noqa: E402
import gen_types  # noqa: E402

PYPROJECT = os.path.join(HERE, "pyproject.toml")


class BackendTest(unittest.TestCase):
    def build(self, fn):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        name = fn(d)
        with open(os.path.join(d, name), "rb") as f:
            return name, f.read()

    def test_pyproject_names_this_backend(self):
        # pip builds with build_backend.py from the source tree, and
        # installs nothing to do so.
        with open(PYPROJECT) as f:
            text = f.read()
        self.assertRegex(text, r'(?m)^requires = \[\]$')
        self.assertRegex(text, r'(?m)^build-backend = "build_backend"$')
        self.assertRegex(text, r'(?m)^backend-path = \["\."\]$')
        self.assertEqual(build_backend.get_requires_for_build_wheel(), [])
        self.assertEqual(build_backend.get_requires_for_build_sdist(), [])

    def test_project_read_without_tomllib(self):
        # Python 3.9 and 3.10 have no tomllib: the backend's own reading
        # of [project] gives what tomllib gives.
        with open(PYPROJECT) as f:
            text = f.read()
        got = build_backend._read_project(text)
        self.assertEqual((got["name"], got["version"], got["requires-python"], got["dependencies"]),
                         ("agentrun", agentrun.__version__, ">=3.9", []))
        self.assertIn("Typing :: Typed", got["classifiers"])
        try:
            import tomllib
        except ImportError:
            return
        self.assertEqual(got, tomllib.loads(text)["project"])
        tricky = ('[tool.x]\nname = "no"\n[project]\nname = "a" # c\nversion = "1#2"\n'
                  'classifiers = [\n  "x \\" y", # one\n  "z",\n]\n[other]\nversion = "no"\n')
        self.assertEqual(build_backend._read_project(tricky), tomllib.loads(tricky)["project"])
        with self.assertRaises(ValueError):
            build_backend._read_project('[project]\nversion = 1\n')

    def test_wheel(self):
        name, data = self.build(build_backend.build_wheel)
        self.assertEqual(name, "agentrun-%s-py3-none-any.whl" % agentrun.__version__)
        z = zipfile.ZipFile(io.BytesIO(data))
        info = "agentrun-%s.dist-info/" % agentrun.__version__
        names = z.namelist()
        self.assertEqual(sorted(n for n in names if n.startswith("agentrun/")),
                         ["agentrun/__init__.py", "agentrun/client.py", "agentrun/py.typed", "agentrun/types.py"])
        self.assertEqual(sorted(n for n in names if not n.startswith("agentrun/")),
                         [info + "METADATA", info + "RECORD", info + "WHEEL"])
        meta = z.read(info + "METADATA").decode()
        for line in ("Metadata-Version: 2.1", "Name: agentrun", "Version: " + agentrun.__version__,
                     "Requires-Python: >=3.9", "Description-Content-Type: text/markdown"):
            self.assertIn(line + "\n", meta)
        self.assertIn("pip install ./clients/python", meta)  # the README, as the description
        self.assertIn("Tag: py3-none-any\n", z.read(info + "WHEEL").decode())
        # RECORD lists every other file with its hash and size.
        rows = list(csv.reader(io.StringIO(z.read(info + "RECORD").decode())))
        self.assertEqual(sorted(r[0] for r in rows), sorted(names))
        for path, digest, size in rows:
            if path == info + "RECORD":
                self.assertEqual((digest, size), ("", ""))
                continue
            body = z.read(path)
            want = base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode()
            self.assertEqual((digest, size), ("sha256=" + want, str(len(body))), path)
        # The same bytes each time.
        self.assertEqual(self.build(build_backend.build_wheel)[1], data)

    def test_sdist(self):
        name, data = self.build(build_backend.build_sdist)
        root = "agentrun-%s/" % agentrun.__version__
        self.assertEqual(name, root[:-1] + ".tar.gz")
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            members = {m.name: m for m in tar.getmembers()}
            self.assertEqual(sorted(members), sorted(root + p for p in [
                "PKG-INFO", "README.md", "build_backend.py", "pyproject.toml", "agentrun/__init__.py",
                "agentrun/client.py", "agentrun/py.typed", "agentrun/types.py"]))
            self.assertTrue(all(m.isfile() and m.mode == 0o644 for m in members.values()))
            self.assertIn("Name: agentrun\n", tar.extractfile(root + "PKG-INFO").read().decode())
        self.assertEqual(self.build(build_backend.build_sdist)[1], data)

    def test_editable(self):
        name, data = self.build(build_backend.build_editable)
        z = zipfile.ZipFile(io.BytesIO(data))
        self.assertEqual(z.read("_agentrun_editable.pth").decode().strip(), os.path.abspath(HERE))


class TypesTest(unittest.TestCase):
    def test_types_are_the_documents(self):
        # agentrun/types.py is what gen_types.py makes of serve's OpenAPI
        # document (when the client runs from a checkout).
        if not os.path.exists(gen_types.DOCUMENT):
            self.skipTest("not in a checkout: no %s" % gen_types.DOCUMENT)
        with open(gen_types.DOCUMENT) as f:
            want = gen_types.generate(json.load(f))
        with open(gen_types.OUTPUT) as f:
            self.assertEqual(f.read(), want, "agentrun/types.py is stale: run python3 clients/python/gen_types.py")

    def test_result_keys(self):
        hints = typing.get_type_hints(agentrun.Result)
        self.assertIn("value", hints)
        self.assertEqual(hints["display"], typing.List[typing.Dict[str, str]])
        self.assertIn("exit_code", agentrun.Result.__required_keys__)
        self.assertIn("state", agentrun.Result.__optional_keys__)

    def test_typed_throughout(self):
        # PEP 561: py.typed ships with the package, and every public
        # function and method says what it takes and gives.
        self.assertTrue(os.path.exists(os.path.join(os.path.dirname(agentrun.__file__), "py.typed")))
        checked = 0
        for name in agentrun.__all__:
            obj = getattr(agentrun, name)
            if not inspect.isclass(obj) or issubclass(obj, dict):  # not a TypedDict
                continue
            for attr, fn in vars(obj).items():
                if not inspect.isfunction(fn) or (attr.startswith("_") and attr not in ("__init__", "__enter__", "__exit__")):
                    continue
                hints = typing.get_type_hints(fn)
                params = [p for p in inspect.signature(fn).parameters if p != "self"]
                self.assertIn("return", hints, "%s.%s has no return type" % (name, attr))
                for p in params:
                    self.assertIn(p, hints, "%s.%s: %s has no type" % (name, attr, p))
                checked += 1
        self.assertGreater(checked, 40)


if __name__ == "__main__":
    unittest.main()
