package integration

import (
	"encoding/json"
	"testing"

	"github.com/agentrun/agentrun/test/testenv"
)

// TestPythonStdlibUnderKernelSurface: python's standard library works
// under the kernel surface's allowlist on both runtimes: getaddrinfo with
// AI_ADDRCONFIG (libc asks NETLINK_ROUTE which address families the host
// has), the interfaces list (NETLINK_ROUTE), asyncio (its self-pipe is a
// socketpair(AF_UNIX)) with a TCP connection over the loopback, a
// multiprocessing pool of 2, subprocess, an ssl context, a pty, a thread
// (glibc's pthread_create tries clone3 first, which fails with ENOSYS on
// both runtimes, and falls back to clone), TCP and UDP sockets of both
// families with protocol 0 and their own, a UDP datagram over the
// loopback; while a netlink socket of another protocol, an AF_ALG socket,
// MPTCP and UDP-Lite fail as on a kernel without them.
func TestPythonStdlibUnderKernelSurface(t *testing.T) {
	testenv.RequireRoot(t)
	code := `import asyncio, multiprocessing, os, socket, ssl, subprocess, sys, threading
print("dns", sorted({a[4][0] for a in socket.getaddrinfo("localhost", 80, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_ADDRCONFIG)} & {"127.0.0.1", "::1"}) != [])
print("ifaces", "lo" in [n for _, n in socket.if_nameindex()])

async def main():
    async def echo(r, w):
        w.write(await r.read(2))
        await w.drain()
        w.close()
    srv = await asyncio.start_server(echo, "127.0.0.1", 0)
    r, w = await asyncio.open_connection(*srv.sockets[0].getsockname())
    w.write(b"hi")
    await w.drain()
    got = await r.read(2)
    w.close()
    srv.close()
    return got.decode()
print("asyncio", asyncio.run(main()))

def sq(x):
    return x * x
with multiprocessing.Pool(2) as p:
    print("pool", p.map(sq, range(4)))
print("subprocess", subprocess.run([sys.executable, "-c", "print(6*7)"], capture_output=True, text=True, check=True).stdout.strip())
print("ssl", ssl.create_default_context().verify_mode == ssl.CERT_REQUIRED)
m, s = os.openpty()
os.write(m, b"x\n")
print("pty", os.read(s, 2))
t = threading.Thread(target=print, args=("thread", "ok"))
t.start()
t.join()
for fam in (socket.AF_INET, socket.AF_INET6):
    for typ, proto in ((socket.SOCK_STREAM, 0), (socket.SOCK_STREAM, socket.IPPROTO_TCP), (socket.SOCK_DGRAM | socket.SOCK_NONBLOCK, 0), (socket.SOCK_DGRAM, socket.IPPROTO_UDP)):
        socket.socket(fam, typ, proto).close()
print("tcp and udp", "ok")
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind(("127.0.0.1", 0))
u.sendto(b"u", u.getsockname())
print("udp", u.recv(1))
for name, args in [("xfrm", (socket.AF_NETLINK, socket.SOCK_RAW, 6)), ("alg", (38, socket.SOCK_SEQPACKET, 0)),
                   ("mptcp", (socket.AF_INET, socket.SOCK_STREAM, 262)), ("udplite", (socket.AF_INET6, socket.SOCK_DGRAM, 136))]:
    try:
        socket.socket(*args)
        print(name, "created")
    except OSError as e:
        print(name, "refused")
`
	task, _ := json.Marshal(map[string]any{"code": code, "limits": map[string]any{"timeout": "60s"}})
	want := "dns True\nifaces True\nasyncio hi\npool [0, 1, 4, 9]\nsubprocess 42\nssl True\npty b'x\\n'\nthread ok\ntcp and udp ok\nudp b'u'\nxfrm refused\nalg refused\nmptcp refused\nudplite refused\n"
	eachRuntime(t, func(t *testing.T, rt string) {
		res := runIn(t, rt, string(task))
		if res.Stdout != want {
			t.Errorf("stdout %q, stderr %q, error %q; want %q", res.Stdout, res.Stderr, res.Error, want)
		}
	})
}
