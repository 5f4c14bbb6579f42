package mcpserver

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// multiRoundTrip is the first protocol version whose clients answer a
// call's questions (an input-required result) themselves.
const multiRoundTrip = "2026-07-28"

// maxRounds bounds the questions one call asks a client of an older
// protocol: each held request or tool call of its run is one.
const maxRounds = 256

// everyRound asks a client of a protocol older than multi-round-trip
// every question a call asks, not only its first. The SDK asks such a
// client a call's first questions itself and calls the handler once more
// with the answers; a run that then holds another request (or tool call)
// answers with its question, which this middleware, outside the SDK's,
// asks in turn, as many times as the run asks, up to maxRounds. A client
// of a newer protocol gets each question in the call's result, as the
// protocol says.
func everyRound(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		ss, ok := req.GetSession().(*mcp.ServerSession)
		if method != "tools/call" || !ok || newProtocol(ss) {
			return res, err
		}
		for round := 0; err == nil && round < maxRounds; round++ {
			ct, ok := res.(*mcp.CallToolResult)
			if !ok || len(ct.InputRequests) == 0 {
				break
			}
			answers := mcp.InputResponseMap{}
			for id, q := range ct.InputRequests {
				p, ok := q.(*mcp.ElicitParams)
				if !ok {
					return res, err
				}
				a, eerr := ss.Elicit(ctx, p)
				if eerr != nil {
					return nil, eerr
				}
				answers[id] = a
			}
			if !retryWith(req, answers, ct.RequestState) {
				return res, err
			}
			res, err = next(ctx, method, req)
		}
		return res, err
	}
}

// newProtocol reports whether ss's client answers questions itself.
func newProtocol(ss *mcp.ServerSession) bool {
	ip := ss.InitializeParams()
	return ip == nil || ip.ProtocolVersion >= multiRoundTrip
}

// retryWith puts a call's answers and state in req's params, for the
// handler to be called again with them.
func retryWith(req mcp.Request, answers mcp.InputResponseMap, state string) bool {
	switch p := req.GetParams().(type) {
	case *mcp.CallToolParamsRaw:
		p.InputResponses, p.RequestState = answers, state
	case *mcp.CallToolParams:
		p.InputResponses, p.RequestState = answers, state
	default:
		return false
	}
	return true
}
