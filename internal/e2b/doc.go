// Package e2b is serve's E2B door (spec §18, docs/e2b.md): E2B's SDKs
// (npm e2b, @e2b/code-interpreter, and the Python ones, which speak the
// same protocol) work against agentrun serve when E2B_API_URL and
// E2B_SANDBOX_URL both name serve's /e2b and E2B_API_KEY is a key of the
// config's e2b.keys. Every E2B sandbox is a live sandbox (spec §17) of
// the key's user: this package speaks only to runapi's Sandboxes and the
// config, never to the runtimes, the proxy or the image store, and runs
// nothing of its own inside a sandbox.
//
// # Routing
//
// Handler is mounted at /e2b and sees paths without that prefix. A
// request that carries E2b-Sandbox-Id is a call into that sandbox; any
// other is the control API (control.go), which takes the key in
// X-API-Key and answers a missing or wrong one 401.
//
// # Plug points: calls into a sandbox
//
// A call into a sandbox is checked before any handler sees it (call.go):
// the sandbox is looked up by its id among this door's (one that is none
// or has ended is answered 502 in E2B's shape, as E2B's own proxy
// answers for a sandbox gone, which the SDKs turn into their errors);
// then X-Access-Token must be the sandbox's envdAccessToken (compared in
// constant time; 401 otherwise) for envd's port and the code
// interpreter's (where a call without it may carry the
// trafficAccessToken instead, as @e2b/code-interpreter's context calls
// do), and E2B-Traffic-Access-Token its trafficAccessToken for any other
// port. The one exception is envd's /files with a signature
// and no token (the SDK's uploadUrl and downloadUrl): the signature is
// checked here against the token, for the query's path and username and
// the method's operation (read for GET and HEAD, write otherwise), and
// its expiration; a /files handler need not check it again, but must
// take the path and user from that same query. Every credential given
// is checked under serve's throttle of wrong ones (Handler.Guess). A
// sandbox is also reached by the Host PORT-ID.DOMAIN when e2b.domain is
// set (the headers are then set from it). Then, by E2b-Sandbox-Port:
//
//   - EnvdPort (49983), envd: Handler's envd mux. This package serves
//     /health and the process service (process.go); envd_fs.go's
//     routeFilesystem adds the filesystem service and /files.
//   - InterpreterPort (49999), the code interpreter: Handler's interp
//     mux, which interp.go's routeInterpreter fills (/execute,
//     /contexts…).
//   - any other port: forwarded to the sandbox's own port (ports.go).
//
// A handler on either mux gets its call with CallOf(r.Context()): the
// runapi.Sandbox, the sandbox's E2B id, its key's user, and Keep, for
// state that lives as long as the sandbox (an interpreter's context): a
// value kept that is an io.Closer is closed once the sandbox ends through
// this door (kill, expiry found, serve's stop through Close). The
// request's body is not read or bounded by the checks: each handler
// bounds what it reads (http.MaxBytesReader, connect.WithReadMaxBytes).
// A plain HTTP handler answers errors with WriteError (E2B's
// {"code","message"} shape: 400, 401, 404, 429 with Retry-After, 507 are
// what the SDKs map to their own errors); a Connect service with
// connect.Error codes. Neither route file imports another's.
package e2b
