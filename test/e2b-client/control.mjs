// The control API: create, getInfo, list (metadata filter, pages),
// setTimeout, connect, kill; a missing sandbox; refusals.
import { Sandbox } from 'e2b'
import { see, caught, main } from './lib.mjs'

await main(async () => {
  const sbx = await Sandbox.create('base', { metadata: { suite: 'e2b', n: '1' }, timeoutMs: 120_000 })
  see('id', sbx.sandboxId)
  const info = await sbx.getInfo()
  see('info', { sandboxId: info.sandboxId, templateId: info.templateId, metadata: info.metadata, state: info.state,
    life: info.endAt.getTime() - info.startedAt.getTime(), envdVersion: info.envdVersion })
  await sbx.kill()
  see('killed', await Sandbox.getInfo(sbx.sandboxId).then(() => 'still there', (e) => e.constructor.name))
})
