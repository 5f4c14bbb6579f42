"""The agentrun client's build backend (PEP 517, and PEP 660's editable
install), in the Python standard library only: `pip install
./clients/python` needs nothing from the network, on any Python 3.9 or
later (pyproject.toml: build-backend "build_backend", backend-path ".").

The wheel holds the agentrun package (its .py files and py.typed) and
its .dist-info (METADATA, WHEEL, RECORD); the sdist the package, this
backend, pyproject.toml, README.md and PKG-INFO. The metadata is
pyproject.toml's [project] table. Both archives are the same bytes each
time for the same files (entries sorted, times SOURCE_DATE_EPOCH's or
1980's, modes 0644).

    python3 build_backend.py DIR    # writes the wheel and the sdist into DIR
"""

import base64
import gzip
import hashlib
import io
import os
import re
import sys
import tarfile
import time
import zipfile
from typing import Any, Dict, List, Mapping, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "agentrun"

# The [project] keys the metadata is made of; any other is refused, so
# that pyproject.toml cannot say what the package silently lacks.
_KEYS = {"name", "version", "description", "readme", "requires-python", "dependencies", "classifiers"}


def _toml_value(text: str, where: str) -> Any:
    """A TOML basic string, or an array of them, as _read_project takes."""
    text = text.strip()
    if text.startswith("["):
        inner = text[1:-1].strip()
        items = re.findall(r'"((?:[^"\\]|\\.)*)"\s*(?:,|$)', inner)
        if re.sub(r'"(?:[^"\\]|\\.)*"\s*,?', "", inner).strip():
            raise ValueError("%s: only an array of strings is read here" % where)
        return [_unescape(i) for i in items]
    m = re.fullmatch(r'"((?:[^"\\]|\\.)*)"', text)
    if not m:
        raise ValueError("%s: only a basic string is read here" % where)
    return _unescape(m.group(1))


def _unescape(s: str) -> str:
    return re.sub(r'\\(["\\])', r"\1", s)


def _strip_comment(line: str) -> str:
    """line without its comment (a # outside a string) and spaces."""
    quoted = escaped = False
    for i, c in enumerate(line):
        if escaped:
            escaped = False
        elif quoted and c == "\\":
            escaped = True
        elif c == '"':
            quoted = not quoted
        elif c == "#" and not quoted:
            return line[:i].strip()
    return line.strip()


def _read_project(text: str) -> Dict[str, Any]:
    """pyproject.toml's [project] table, read without tomllib (Python
    3.11's): each key a basic string or an array of basic strings, an
    array over several lines; comments and other tables skipped."""
    project: Dict[str, Any] = {}
    table = ""
    pending = ""
    key = ""
    for n, raw in enumerate(text.splitlines(), 1):
        line = _strip_comment(raw)
        if pending:
            pending += " " + line
            if line.endswith("]"):
                project[key] = _toml_value(pending, "pyproject.toml:%d" % n)
                pending = ""
            continue
        if not line:
            continue
        if line.startswith("["):
            table = line.strip("[] ")
            continue
        if table != "project":
            continue
        key, _, value = (p.strip() for p in line.partition("="))
        if value.startswith("[") and not value.endswith("]"):
            pending = value
            continue
        project[key] = _toml_value(value, "pyproject.toml:%d" % n)
    return project


def _project() -> Dict[str, Any]:
    with open(os.path.join(HERE, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    if sys.version_info >= (3, 11):
        import tomllib
        project = tomllib.loads(text)["project"]
    else:
        project = _read_project(text)
    unknown = sorted(set(project) - _KEYS)
    if unknown:
        raise ValueError("pyproject.toml: [project] %s: not read by build_backend.py" % ", ".join(unknown))
    if project.get("dependencies"):
        raise ValueError("pyproject.toml: the client depends on nothing")
    return project


def _names(project: Mapping[str, Any]) -> Tuple[str, str]:
    """The distribution's name as file names spell it, and its version."""
    return re.sub(r"[-_.]+", "_", project["name"]).lower(), project["version"]


def metadata(project: Mapping[str, Any]) -> str:
    """The core metadata (METADATA, PKG-INFO), version 2.1."""
    lines = ["Metadata-Version: 2.1", "Name: " + project["name"], "Version: " + project["version"]]
    if project.get("description"):
        lines.append("Summary: " + project["description"])
    if project.get("requires-python"):
        lines.append("Requires-Python: " + project["requires-python"])
    lines.extend("Classifier: " + c for c in project.get("classifiers", []))
    body = ""
    if project.get("readme"):
        lines.append("Description-Content-Type: text/markdown")
        with open(os.path.join(HERE, project["readme"]), encoding="utf-8") as f:
            body = f.read()
    return "\n".join(lines) + "\n\n" + body


def _package_files() -> List[str]:
    """The package's files, relative to HERE, sorted: its .py files and
    py.typed, no bytecode."""
    names = []
    for name in sorted(os.listdir(os.path.join(HERE, PACKAGE))):
        if name.endswith(".py") or name == "py.typed":
            names.append(PACKAGE + "/" + name)
    return names


def _read(rel: str) -> bytes:
    with open(os.path.join(HERE, rel), "rb") as f:
        return f.read()


def _epoch() -> int:
    """The archives' time: SOURCE_DATE_EPOCH's, else 1980-01-01 (the
    earliest a zip holds)."""
    return max(int(os.environ.get("SOURCE_DATE_EPOCH", "0")), 315532800)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")


def _dist_info(project: Mapping[str, Any]) -> Tuple[str, List[Tuple[str, bytes]]]:
    name, version = _names(project)
    info = "%s-%s.dist-info" % (name, version)
    wheel = "Wheel-Version: 1.0\nGenerator: agentrun build_backend.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    return info, [(info + "/METADATA", metadata(project).encode()), (info + "/WHEEL", wheel.encode())]


def _write_wheel(directory: str, files: List[Tuple[str, bytes]], project: Mapping[str, Any]) -> str:
    """Writes the wheel of files (and the .dist-info) into directory and
    returns its file name."""
    name, version = _names(project)
    info, meta = _dist_info(project)
    files = files + meta
    record = "".join("%s,%s,%d\n" % (path, _record_hash(data), len(data)) for path, data in files)
    files.append((info + "/RECORD", (record + info + "/RECORD,,\n").encode()))
    wheel = "%s-%s-py3-none-any.whl" % (name, version)
    stamp = time.gmtime(_epoch())[:6]
    tmp = os.path.join(directory, "." + wheel + ".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            zi = zipfile.ZipInfo(path, date_time=stamp)
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    os.replace(tmp, os.path.join(directory, wheel))
    return wheel


# --- PEP 517 ---

def get_requires_for_build_wheel(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str,
                                     config_settings: Optional[Dict[str, Any]] = None) -> str:
    info, files = _dist_info(_project())
    os.makedirs(os.path.join(metadata_directory, info), exist_ok=True)
    for path, data in files:
        with open(os.path.join(metadata_directory, path), "wb") as f:
            f.write(data)
    return info


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None,
                metadata_directory: Optional[str] = None) -> str:
    return _write_wheel(wheel_directory, [(p, _read(p)) for p in _package_files()], _project())


def build_editable(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None,
                   metadata_directory: Optional[str] = None) -> str:
    """A wheel whose .pth puts this directory on sys.path: the checkout's
    package is the one imported."""
    name, _ = _names(_project())
    return _write_wheel(wheel_directory, [("_%s_editable.pth" % name, (HERE + "\n").encode())], _project())


def build_sdist(sdist_directory: str, config_settings: Optional[Dict[str, Any]] = None) -> str:
    project = _project()
    name, version = _names(project)
    root = "%s-%s" % (name, version)
    files = [(p, _read(p)) for p in ["pyproject.toml", "build_backend.py", project.get("readme") or "README.md"]
             + _package_files()]
    files.append(("PKG-INFO", metadata(project).encode()))
    sdist = root + ".tar.gz"
    tmp = os.path.join(sdist_directory, "." + sdist + ".tmp")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, data in sorted(files):
            ti = tarfile.TarInfo(root + "/" + path)
            ti.size, ti.mtime, ti.mode = len(data), _epoch(), 0o644
            tar.addfile(ti, io.BytesIO(data))
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=_epoch()) as gz:
        gz.write(buf.getvalue())
    os.replace(tmp, os.path.join(sdist_directory, sdist))
    return sdist


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 build_backend.py DIR")
    os.makedirs(sys.argv[1], exist_ok=True)
    for made in (build_wheel(sys.argv[1]), build_sdist(sys.argv[1])):
        print(os.path.join(sys.argv[1], made))
