// A sandbox that reaches its timeout ends: the SDK then finds none, and
// a command into it fails.
import { Sandbox } from 'e2b'
import { see, caught, main } from './lib.mjs'

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

await main(async () => {
  const sbx = await Sandbox.create({ timeoutMs: 2_000 })
  see('ran', (await sbx.commands.run('echo before')).stdout)
  let gone = ''
  for (let i = 0; i < 600 && !gone; i++) {
    await sleep(100)
    gone = await Sandbox.getInfo(sbx.sandboxId).then(() => '', (e) => e.constructor.name)
  }
  see('gone', gone)
  await caught('after', sbx.commands.run('echo after'))
  see('running', await sbx.isRunning())
})
