// envd's process service through the SDK: commands.run (output, exit
// code, a failing command), env and cwd, a background command fed its
// stdin and killed, list, connect, a PTY with input and a resize.
import { Sandbox, CommandExitError } from 'e2b'
import { see, caught, main } from './lib.mjs'

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

await main(async () => {
  const sbx = await Sandbox.create('base', { timeoutMs: 120_000, envs: { FROM_CREATE: 'c1' } })
  see('id', sbx.sandboxId)
  see('kernel', (await sbx.commands.run('uname -r')).stdout.trim())

  const r = await sbx.commands.run('echo out; echo err >&2; id -u; echo $FROM_CREATE $FROM_RUN; pwd', { envs: { FROM_RUN: 'r1' }, cwd: '/tmp' })
  see('run', { stdout: r.stdout, stderr: r.stderr, exitCode: r.exitCode })

  let streamed = ''
  await sbx.commands.run('printf a; sleep 0.2; printf b', { onStdout: (d) => { streamed += d } })
  see('streamed', streamed)

  const failed = await caught('failed', sbx.commands.run('echo bad >&2; exit 3'))
  if (failed.error) {
    try { await sbx.commands.run('echo bad >&2; exit 3') } catch (e) {
      see('failedDetail', { isCommandExitError: e instanceof CommandExitError, exitCode: e.exitCode, stderr: e.stderr })
    }
  }

  // In the background: fed its stdin, listed, connected to, killed.
  let bgOut = ''
  const bg = await sbx.commands.run('read line; echo got:$line; sleep 600', { background: true, stdin: true, onStdout: (d) => { bgOut += d } })
  await sbx.commands.sendStdin(bg.pid, 'hello\n')
  for (let i = 0; i < 100 && !bgOut.includes('got:'); i++) await sleep(50)
  see('bgOut', bgOut)
  const listed = await sbx.commands.list()
  see('listed', listed.some((p) => p.pid === bg.pid && p.cmd === '/bin/bash'))
  const again = await sbx.commands.connect(bg.pid)
  see('connectedPid', again.pid)
  see('killed', await sbx.commands.kill(bg.pid))
  const bgEnd = await caught('bgWait', bg.wait())
  see('listedAfterKill', (await sbx.commands.list()).some((p) => p.pid === bg.pid))
  see('killMissing', await sbx.commands.kill(999999))

  // timeoutMs is the command's: past it, it is killed.
  await caught('timedOut', sbx.commands.run('sleep 31', { timeoutMs: 1_000 }))
  let stillThere = true
  for (let i = 0; i < 100 && stillThere; i++) {
    await sleep(100)
    stillThere = (await sbx.commands.list()).some((p) => p.args.includes('sleep 31'))
  }
  see('timedOutGone', !stillThere)

  // closeStdin: cat ends at its end of file.
  const cat = await sbx.commands.run('cat', { background: true, stdin: true })
  await sbx.commands.sendStdin(cat.pid, 'to-cat\n')
  await sbx.commands.closeStdin(cat.pid)
  const catEnd = await cat.wait()
  see('cat', { stdout: catEnd.stdout, exitCode: catEnd.exitCode })

  // A terminal: input goes to the shell, a resize reaches stty.
  let ptyOut = ''
  const dec = new TextDecoder()
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { ptyOut += dec.decode(d) } })
  await sbx.pty.resize(term.pid, { cols: 100, rows: 40 })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size; echo pty-$((6*7))\nexit\n'))
  const ptyEnd = await caught('ptyWait', term.wait())
  see('pty', { out: ptyOut.includes('40 100'), answer: ptyOut.includes('pty-42') })

  await sbx.kill()
})
