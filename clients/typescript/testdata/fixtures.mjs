// What the adapters' tests share (test/*.test.mjs): kept out of test/,
// where node's runner would take this for a test file.

/**
 * A new session name for a tool's runs: serve's quota counts runs per
 * session (3 a minute in TestTypeScriptClient's config), and runs
 * without one share one.
 */
export const session = () => "ts-" + Math.random().toString(16).slice(2, 14);

/**
 * A real 1x1 PNG, made with Python's standard library (the test images
 * have no matplotlib), shown by display(): the display protocol's
 * _repr_png_. `FIGURE + "Fig()"` also makes it the value.
 */
export const FIGURE = `import zlib, struct
def _png():
    def chunk(t, d): return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    return (b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\\x00\\xff\\x00\\x00")) + chunk(b"IEND", b""))
class Fig:
    def __repr__(self): return "<Fig>"
    def _repr_png_(self): return _png()
display(Fig())
print("drawn")
`;

/** A value whose text/html (38015 characters) is far past an answer's bound. */
export const TABLE = `class Table:
    def __repr__(self): return "Table(2000 rows)"
    def _repr_html_(self): return "<table>" + "<tr><td>x</td></tr>" * 2000 + "</table>"
Table()
`;

/** Whether b64 is a PNG's base64. */
export const isPNG = (b64) => Buffer.from(b64, "base64").subarray(0, 8).equals(Buffer.from("\x89PNG\r\n\x1a\n", "latin1"));
