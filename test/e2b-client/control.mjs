// The control API: create, getInfo, list (metadata filter, pages),
// setTimeout, connect, kill; a missing sandbox, a wrong key, another
// key's sandbox; refusals. argv[2] is a second key (another user's).
import { Sandbox } from 'e2b'
import { see, caught, main } from './lib.mjs'

const otherKey = process.argv[2]

await main(async () => {
  const sbx = await Sandbox.create('base', { metadata: { suite: 'e2b', n: '1' }, timeoutMs: 120_000 })
  const sbx2 = await Sandbox.create({ metadata: { suite: 'e2b', n: '2' }, timeoutMs: 60_000 })
  const sbx3 = await Sandbox.create({ metadata: { suite: 'other' }, timeoutMs: 60_000 })
  see('id', sbx.sandboxId)
  const info = await sbx.getInfo()
  see('info', { sandboxId: info.sandboxId, templateId: info.templateId, metadata: info.metadata, state: info.state,
    life: info.endAt.getTime() - info.startedAt.getTime(), envdVersion: info.envdVersion })

  // list: by metadata, and in pages of one.
  const byMeta = await Sandbox.list({ query: { metadata: { suite: 'e2b' } } }).nextItems()
  see('listSuite', byMeta.map((s) => s.metadata.n).sort())
  const pager = Sandbox.list({ limit: 1 })
  const pages = []
  while (pager.hasNext) pages.push((await pager.nextItems()).map((s) => s.sandboxId))
  see('pages', pages)
  see('paused', (await Sandbox.list({ query: { state: ['paused'] } }).nextItems()).length)

  // setTimeout moves endAt; connect answers the same sandbox, usable.
  await sbx2.setTimeout(300_000)
  const info2 = await sbx2.getInfo()
  see('setTimeout', Math.round((info2.endAt.getTime() - Date.now()) / 1000))
  await caught('setTimeoutPastMax', sbx2.setTimeout(48 * 3600_000))
  const again = await Sandbox.connect(sbx.sandboxId)
  see('connect', { same: again.sandboxId === sbx.sandboxId, echo: (await again.commands.run('echo via-connect')).stdout })

  // Refusals in E2B's shape.
  await caught('pause', sbx.pause())
  await caught('badTemplate', Sandbox.create('no-such-template'))
  await caught('internet', Sandbox.create({ allowInternetAccess: true }))
  await caught('cidr', Sandbox.create({ network: { allowOut: ['10.0.0.0/8'] } }))

  // Another key: none of these sandboxes is its.
  const other = { apiKey: otherKey }
  see('otherList', (await Sandbox.list(other).nextItems()).length)
  await caught('otherGet', Sandbox.getInfo(sbx.sandboxId, other))
  await caught('otherConnect', Sandbox.connect(sbx.sandboxId, other))
  see('otherKill', await Sandbox.kill(sbx.sandboxId, other))
  await caught('otherTimeout', Sandbox.setTimeout(sbx.sandboxId, 10_000, other))

  // A wrong key, a missing sandbox.
  await caught('wrongKey', Sandbox.create({ apiKey: 'e2b_' + '0'.repeat(40) }))
  await caught('wrongKeyList', Sandbox.list({ apiKey: 'e2b_' + '0'.repeat(40) }).nextItems())
  await caught('missingGet', Sandbox.getInfo('sb-' + '0'.repeat(32)))
  await caught('missingConnect', Sandbox.connect('sb-' + '0'.repeat(32)))
  see('missingKill', await Sandbox.kill('sb-' + '0'.repeat(32)))

  // Calls into a sandbox need its access token: a forged one is refused.
  const forged = new Sandbox({ sandboxId: sbx.sandboxId, envdAccessToken: 'f'.repeat(32), envdVersion: info.envdVersion })
  await caught('forgedToken', forged.commands.run('echo in'))

  await sbx.kill()
  await sbx2.kill()
  await sbx3.kill()
  see('killed', await Sandbox.getInfo(sbx.sandboxId).then(() => 'still there', (e) => e.constructor.name))
  await caught('afterKill', sbx.commands.run('echo in'))
  see('listAfter', (await Sandbox.list().nextItems()).length)
})
