// The SDK calls the other scripts leave out, on one code-interpreter
// sandbox (serve's sandboxes.max is 1): a second create past it
// (RateLimitError), commands.run as user root, a handle's disconnect,
// stdin and kill, pty.connect and pty.kill, files.writeFiles, runCode's onResult, the static getInfo,
// getFullInfo, setTimeout and kill of one's own sandbox, and the calls refused
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

  // A handle's own stdin, close and kill.
  const cat = await sbx.commands.run('cat', { background: true, stdin: true })
  await cat.sendStdin('via-handle\n')
  await cat.closeStdin()
  see('handleCat', (await cat.wait()).stdout)
  const sl = await sbx.commands.run('sleep 600', { background: true })
  see('handleKill', await sl.kill())
  await caught('handleKillWait', sl.wait())

  // pty.connect: a second handle on a terminal sees its output.
  const dec = new TextDecoder()
  let seenByConnect = ''
  const t1 = await sbx.pty.create({ cols: 80, rows: 24, onData: () => {} })
  const t2 = await sbx.pty.connect(t1.pid, { onData: (d) => { seenByConnect += dec.decode(d) } })
  await sbx.pty.sendInput(t1.pid, new TextEncoder().encode('echo pty-$((2*3))x\n'))
  for (let i = 0; i < 100 && !seenByConnect.includes('pty-6x'); i++) await new Promise((r) => setTimeout(r, 50))
  see('ptyConnect', { same: t2.pid === t1.pid, saw: seenByConnect.includes('pty-6x') })
  await sbx.pty.kill(t1.pid)

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

  await Sandbox.setTimeout(sbx.sandboxId, 200_000)
  see('staticTimeout', Math.round(((await sbx.getInfo()).endAt.getTime() - Date.now()) / 1000))

  see('instanceConnect', (await sbx.connect()).sandboxId === sbx.sandboxId)
  await caught('mcpToken', sbx.getMcpToken())

  // Refused, saying why.
  await caught('betaPause', Sandbox.betaPause(sbx.sandboxId))
  see('deleteSnapshot', await Sandbox.deleteSnapshot('snap-none'))
  await caught('createSnapshot', sbx.createSnapshot())
  await caught('listSnapshots', Sandbox.listSnapshots().nextItems())
  await caught('fork', Sandbox.fork(sbx.sandboxId).then((r) => r.map((x) => (x instanceof Error ? x.constructor.name + ': ' + x.message : 'forked'))))
  await caught('updateNetwork', sbx.updateNetwork({ allowOut: ['example.com'] }))
  await caught('metrics', sbx.getMetrics())

  see('staticKill', await Sandbox.kill(sbx.sandboxId))
  see('afterKill', await Sandbox.getInfo(sbx.sandboxId).then(() => 'still there', (e) => e.constructor.name))
  see('killAgain', await Sandbox.kill(sbx.sandboxId))
})
