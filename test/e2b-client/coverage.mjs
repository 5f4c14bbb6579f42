// The SDK calls the other scripts leave out, on one code-interpreter
// sandbox (serve's sandboxes.max is 1): a second create past it
// (RateLimitError), commands.run as user root, a handle's disconnect,
// pty.kill, files.writeFiles, runCode's onResult, the static getInfo,
// getFullInfo and kill of one's own sandbox, and the calls refused
// (snapshots, fork, updateNetwork, metrics).
import { Sandbox } from '@e2b/code-interpreter'
import { see, caught, main } from './lib.mjs'

await main(async () => {
  const sbx = await Sandbox.create('code-interpreter-v1', { timeoutMs: 120_000 })
  see('id', sbx.sandboxId)

  // Past sandboxes.max: 429 with Retry-After, which the SDK waits out
  // only within its request timeout.
  await caught('overMax', Sandbox.create('base', { requestTimeoutMs: 1_000 }).then(async (s) => { await s.kill(); return 'created' }))

  // E2B's user never changes who runs.
  const asDefault = await sbx.commands.run('id -u')
  const asRoot = await sbx.commands.run('id -u', { user: 'root' })
  see('uids', { default: asDefault.stdout.trim(), root: asRoot.stdout.trim() })

  // A handle disconnected from leaves its command running.
  const bg = await sbx.commands.run('sleep 600', { background: true })
  await bg.disconnect()
  see('afterDisconnect', (await sbx.commands.list()).some((p) => p.pid === bg.pid))
  see('killBg', await sbx.commands.kill(bg.pid))

  // pty.kill ends the terminal.
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: () => {} })
  see('ptyKill', await sbx.pty.kill(term.pid))
  await caught('ptyWait', term.wait())
  see('ptyListed', (await sbx.commands.list()).some((p) => p.pid === term.pid))

  // writeFiles: several files at once.
  const written = await sbx.files.writeFiles([{ path: 'wf/a.txt', data: 'A' }, { path: '/tmp/wf-b.txt', data: new TextEncoder().encode('BB') }])
  see('writeFiles', { paths: written.map((w) => w.path), a: await sbx.files.read('wf/a.txt'), b: await sbx.files.read('/tmp/wf-b.txt') })

  // runCode's onResult sees the main result as it comes.
  const results = []
  const exec = await sbx.runCode('x = 6 * 7\nx', { onResult: (r) => results.push({ text: r.text, main: r.isMainResult }) })
  see('onResult', { streamed: results, text: exec.text })

  // The static calls on one's own sandbox.
  const info = await Sandbox.getInfo(sbx.sandboxId)
  see('staticInfo', { same: info.sandboxId === sbx.sandboxId, state: info.state })
  const full = await caught('fullInfo', Sandbox.getFullInfo(sbx.sandboxId).then((i) => ({ same: i.sandboxId === sbx.sandboxId, state: i.state })))

  // Refused, saying why.
  await caught('createSnapshot', sbx.createSnapshot())
  await caught('listSnapshots', Sandbox.listSnapshots().nextItems())
  await caught('fork', Sandbox.fork(sbx.sandboxId).then((r) => r.map((x) => (x instanceof Error ? x.constructor.name + ': ' + x.message : 'forked'))))
  await caught('updateNetwork', sbx.updateNetwork({ allowOut: ['example.com'] }))
  await caught('metrics', sbx.getMetrics())

  see('staticKill', await Sandbox.kill(sbx.sandboxId))
  see('afterKill', await Sandbox.getInfo(sbx.sandboxId).then(() => 'still there', (e) => e.constructor.name))
  see('killAgain', await Sandbox.kill(sbx.sandboxId))
})
