// Package worker runs tasks from a NATS JetStream work-queue stream
// (`agentrun worker`) and is the client side of that bus (`agentrun
// submit`, `agentrun result`).
//
// A task is a message on the config's subject whose data is task.json and
// whose Nats-Msg-Id header is the task id; the stream drops a second
// publish of the same id within its de-duplication window. Workers share
// one durable pull consumer. Delivery is at least once and results exactly
// once: a worker stores the result in the results bucket with a create
// (the first result of an id wins) before it acks the message, and acks a
// message whose result exists without running it. A running task is kept
// alive with in-progress acks. A task refused by the worker's policy gets
// its refusal as result at once; a host failure naks with a delay so that
// another worker can take it, and on the last delivery becomes the
// result, as does a task whose deliveries all ended without an answer
// (a worker that died on it each time).
package worker
