"""Writes agentrun/types.py: a TypedDict for each object schema of serve's
OpenAPI document (internal/server/openapi.json), so that the client's
types come from the document alone, as the TypeScript client's do.

    python3 clients/python/gen_types.py            # from the checkout's root or anywhere
    python3 clients/python/gen_types.py --check    # fails when types.py differs

Standard library only. A schema's required properties are a base class's
(total), the others the class's own (total=False): Python 3.9 has no
NotRequired.
"""

import json
import keyword
import os
import sys
import textwrap
from typing import Any, Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
DOCUMENT = os.path.join(HERE, "..", "..", "internal", "server", "openapi.json")
OUTPUT = os.path.join(HERE, "agentrun", "types.py")

# Schemas named otherwise here: the client's own classes have their names.
RENAMED = {"Sandbox": "SandboxInfo", "Error": "ErrorBody"}

_SCALARS = {"string": "str", "integer": "int", "number": "float", "boolean": "bool"}


def _name(ref: str) -> str:
    base = ref.rsplit("/", 1)[-1]
    return RENAMED.get(base, base)


def _type(schema: Dict[str, Any]) -> str:
    """The Python type of a property's schema."""
    if "$ref" in schema:
        return _name(schema["$ref"])
    kind = schema.get("type")
    if isinstance(kind, list):
        rest = [k for k in kind if k != "null"]
        inner = _type(dict(schema, type=rest[0] if len(rest) == 1 else rest))
        return "Optional[%s]" % inner if "null" in kind else inner
    if kind == "string" and "enum" in schema:
        return "Literal[%s]" % ", ".join(json.dumps(v) for v in schema["enum"])
    if kind in _SCALARS:
        return _SCALARS[kind]
    if kind == "array":
        return "List[%s]" % _type(schema.get("items") or {})
    if kind == "object":
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and extra and not schema.get("properties"):
            return "Dict[str, %s]" % _type(extra)
        return "Dict[str, Any]"
    return "Any"


def _doc(text: str, indent: str) -> List[str]:
    """A docstring's lines: text's first paragraph, wrapped."""
    para = text.strip().split("\n\n")[0].replace('"""', "'''").replace("\\", "\\\\")
    lines = textwrap.wrap(para, 76 - len(indent))
    if not lines:
        return []
    lines[0] = '"""' + lines[0]
    lines[-1] += '"""'
    return [indent + line for line in lines]


def generate(doc: Dict[str, Any]) -> str:
    schemas = doc["components"]["schemas"]
    out = ['"""The types of serve\'s API: a TypedDict for each object of its OpenAPI',
           "document (internal/server/openapi.json), as agentrun's answers come.",
           "",
           "Written by gen_types.py from the document: do not edit; run",
           "`python3 clients/python/gen_types.py` after the document changes.",
           '"""',
           "",
           "from __future__ import annotations",
           "",
           "from typing import Any, Dict, List, Literal, Optional, TypedDict",
           "",
           "__all__ = ["]
    out.extend(textwrap.wrap(", ".join(json.dumps(_name(n)) for n in sorted(schemas, key=_name)), 76,
                             initial_indent="    ", subsequent_indent="    "))
    out.extend(["]", ""])
    aliases: List[Tuple[str, Dict[str, Any]]] = []
    classes: List[Tuple[str, Dict[str, Any]]] = []
    for name in sorted(schemas, key=_name):
        s = schemas[name]
        (classes if s.get("properties") else aliases).append((_name(name), s))
    for name, s in aliases:
        out.append("")
        out.extend("# " + line.strip().strip('"') for line in _doc(s.get("description", ""), "  "))
        out.append("%s = %s" % (name, _type(s)))
    for name, s in classes:
        required = set(s.get("required") or [])
        props = s["properties"]
        for p in props:
            if not p.isidentifier() or keyword.iskeyword(p):
                raise SystemExit("%s.%s: not a Python name" % (name, p))
        must = [p for p in props if p in required]
        may = [p for p in props if p not in required]
        base = "TypedDict"
        if must and may:
            base = "_%sRequired" % name
            out.extend(["", "", "class %s(TypedDict):" % base])
            out.extend("    %s: %s" % (p, _type(props[p])) for p in must)
            must = []
        out.extend(["", "", "class %s(%s%s):" % (name, base, ", total=False" if may else "")])
        out.extend(_doc(s.get("description", ""), "    "))
        if s.get("description") and (must or may):
            out.append("")
        out.extend("    %s: %s" % (p, _type(props[p])) for p in must + may)
        if not must and not may:
            out.append("    pass")
    out.append("")
    return "\n".join(out)


def main(argv: List[str]) -> int:
    with open(DOCUMENT) as f:
        text = generate(json.load(f))
    if argv[1:] == ["--check"]:
        with open(OUTPUT) as f:
            if f.read() != text:
                print("%s differs from what %s gives: run gen_types.py" % (OUTPUT, DOCUMENT), file=sys.stderr)
                return 1
        return 0
    with open(OUTPUT, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
