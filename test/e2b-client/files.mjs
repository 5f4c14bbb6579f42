// envd's filesystem service and /files through the SDK: write and read
// (text, bytes, several files at once, octet-stream), list with depth,
// exists, getInfo, makeDir, rename, remove, watchDir with its events,
// signed upload and download URLs (and forged ones refused), and links,
// a fifo planted inside that never lead a read out or block it.
// argv[2] is a host file the test made, which a planted link names.
import { Sandbox } from 'e2b'
import { see, caught, main } from './lib.mjs'

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const hostSecret = process.argv[2]

await main(async () => {
  const sbx = await Sandbox.create('base', { timeoutMs: 120_000 })
  see('id', sbx.sandboxId)
  const f = sbx.files

  // Text, relative (the home, /workspace), read back by absolute path.
  const w = await f.write('notes/hello.txt', 'hello e2b')
  see('written', { name: w.name, path: w.path, type: w.type })
  see('readText', await f.read('/workspace/notes/hello.txt'))
  // Bytes, in /tmp.
  await f.write('/tmp/bin.dat', new Uint8Array([0, 1, 2, 255, 254]))
  see('readBytes', Array.from(await f.read('/tmp/bin.dat', { format: 'bytes' })))
  // Several at once, and one sent as application/octet-stream.
  const multi = await f.write([{ path: '/workspace/m/a.txt', data: 'A' }, { path: 'm/b/c.txt', data: 'CC' }])
  see('multi', multi.map((e) => e.path))
  await f.write('/workspace/oct.txt', 'octet', { useOctetStream: true })
  see('octet', await f.read('oct.txt'))
  const inside = await sbx.commands.run('cat /workspace/notes/hello.txt /workspace/m/a.txt /workspace/m/b/c.txt /workspace/oct.txt; od -An -tu1 /tmp/bin.dat')
  see('inside', inside.stdout.replace(/\s+/g, ' ').trim())

  // List, one level and two.
  see('list1', (await f.list('/workspace/m')).map((e) => [e.name, e.type, e.path]))
  see('list2', (await f.list('/workspace/m', { depth: 2 })).map((e) => e.path))

  // exists, getInfo.
  see('exists', [await f.exists('/workspace/m/a.txt'), await f.exists('/workspace/nope'), await f.exists('/tmp')])
  const info = await f.getInfo('/workspace/m/b/c.txt')
  see('info', { name: info.name, type: info.type, path: info.path, size: info.size, owner: info.owner,
    permissions: info.permissions, mtime: info.modifiedTime instanceof Date && info.modifiedTime.getTime() > 0 })

  // makeDir (with parents; false when there), rename, remove.
  see('makeDir', [await f.makeDir('/workspace/x/y'), await f.makeDir('/workspace/x/y')])
  const moved = await f.rename('/workspace/m/a.txt', '/workspace/x/y/a2.txt')
  see('renamed', moved.path)
  see('afterRename', [await f.exists('/workspace/m/a.txt'), await f.read('/workspace/x/y/a2.txt')])
  await f.remove('/workspace/x')
  see('removed', await f.exists('/workspace/x'))
  await caught('readMissing', f.read('/workspace/nope'))
  await caught('outside', f.read('/etc/hostname'))
  await caught('outsideList', f.list('/usr'))
  await caught('home', f.write('/home/user/x.txt', 'x'))

  // watchDir: events as the SDK gives them.
  await f.makeDir('/workspace/w')
  const events = []
  const h = await f.watchDir('/workspace/w', (e) => events.push(`${e.type}:${e.name}`), { recursive: true })
  await f.write('/workspace/w/new.txt', 'n')
  await sbx.commands.run('mkdir -p /workspace/w/sub && echo z > /workspace/w/sub/z.txt')
  for (let i = 0; i < 200 && !events.includes('create:sub/z.txt'); i++) await sleep(50)
  await f.remove('/workspace/w/new.txt')
  for (let i = 0; i < 200 && !events.includes('remove:new.txt'); i++) await sleep(50)
  await h.stop()
  see('events', events)

  // The polled watchers (CreateWatcher, GetWatcherEvents,
  // RemoveWatcher: the Python SDK's), on the SDK's own client; at most
  // 16 a sandbox.
  await f.makeDir('/workspace/pw')
  const { watcherId } = await f.rpc.createWatcher({ path: '/workspace/pw', recursive: false })
  await f.write('/workspace/pw/p.txt', 'p')
  const polled = []
  for (let i = 0; i < 200 && !polled.includes('1:p.txt'); i++) {
    const r = await f.rpc.getWatcherEvents({ watcherId })
    polled.push(...r.events.map((e) => `${e.type}:${e.name}`))
    await sleep(50)
  }
  see('polled', polled)
  const more = []
  for (let i = 0; i < 15; i++) more.push((await f.rpc.createWatcher({ path: '/workspace' })).watcherId)
  await caught('watcher17', f.rpc.createWatcher({ path: '/workspace' }).then(() => 'made'))
  for (const id of [watcherId, ...more]) await f.rpc.removeWatcher({ watcherId: id })
  await caught('afterRemoveWatcher', f.rpc.getWatcherEvents({ watcherId }).then(() => 'still there'))
  await caught('watchAFile', f.rpc.createWatcher({ path: '/workspace/pw/p.txt' }).then(() => 'made'))

  // Signed file URLs: upload (multipart) and download, as a third party
  // fetches them (no headers); another path or no signature refused.
  const up = await sbx.uploadUrl('/workspace/up.txt')
  const form = new FormData()
  form.append('file', new Blob(['uploaded']), 'up.txt')
  let res = await fetch(up, { method: 'POST', body: form })
  see('uploadStatus', res.status)
  see('uploaded', await f.read('/workspace/up.txt'))
  const down = await sbx.downloadUrl('/workspace/up.txt')
  res = await fetch(down)
  see('download', [res.status, await res.text()])
  const expiring = await sbx.downloadUrl('/workspace/up.txt', { useSignatureExpiration: 60 })
  res = await fetch(expiring)
  see('downloadExpiring', [res.status, await res.text()])
  const other = new URL(down)
  other.searchParams.set('path', '/workspace/notes/hello.txt')
  see('forgedStatus', (await fetch(other)).status)
  const unsigned = new URL(down)
  unsigned.searchParams.delete('signature')
  see('unsignedStatus', (await fetch(unsigned)).status)
  const readUrlToWrite = new URL(down)
  see('readSignatureToWrite', (await fetch(readUrlToWrite, { method: 'POST', body: form })).status)

  // Planted inside: links to the host's file and to a directory, a
  // fifo. Never followed or waited on; a write over a link replaces it.
  await sbx.commands.run(`ln -s ${hostSecret} /tmp/hlink; ln -s ${hostSecret} /workspace/hlink; ln -s / /workspace/rootlink; mkfifo /workspace/fifo`)
  await caught('readLink', f.read('/tmp/hlink'))
  await caught('readLinkWs', f.read('/workspace/hlink'))
  await caught('readThroughDirLink', f.read('/workspace/rootlink/etc/hostname'))
  await caught('listDirLink', f.list('/workspace/rootlink'))
  await caught('readFifo', f.read('/workspace/fifo'))
  const deep = await f.list('/workspace', { depth: 4 })
  see('deepThroughLink', deep.filter((e) => e.path.startsWith('/workspace/rootlink/')).length)
  const li = await f.getInfo('/workspace/hlink')
  see('linkInfo', { type: li.type, symlinkTarget: li.symlinkTarget })
  const signedLink = await sbx.downloadUrl('/workspace/hlink')
  res = await fetch(signedLink)
  see('downloadLink', [res.status, (await res.text()).includes('host-secret')])
  await f.write('/tmp/hlink', 'pwned')
  see('afterWriteOverLink', (await sbx.commands.run('test -L /tmp/hlink && echo link || cat /tmp/hlink')).stdout)

  // Bounds: a file past 16 MiB; no room in /tmp (64 MiB).
  await caught('tooLarge', f.write('/tmp/big', 'x'.repeat(16 * 1024 * 1024 + 1)))
  await caught('tooLargeOctet', f.write('/tmp/big', 'x'.repeat(16 * 1024 * 1024 + 1), { useOctetStream: true }))
  const chunk = 'y'.repeat(15 * 1024 * 1024)
  for (let i = 0; i < 5; i++) {
    const r = await caught('noRoom', f.write(`/tmp/fill${i}`, chunk).then(() => 'written'))
    if (r.error) break
  }

  // A watch ends when its sandbox does.
  let exited = null
  await f.watchDir('/workspace', () => {}, { onExit: (err) => { exited = err ? err.constructor.name : 'none' } })
  await sbx.kill()
  for (let i = 0; i < 200 && exited === null; i++) await sleep(50)
  see('watchExit', exited)
})
