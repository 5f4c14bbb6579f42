// A sandbox's own port, reached through the door as E2B's proxy is: the
// E2b-Sandbox-Id and E2b-Sandbox-Port headers and the sandbox's traffic
// token; without the token, or with another's, it is refused.
import http from 'node:http'
import { Sandbox } from 'e2b'
import { see, main } from './lib.mjs'

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

await main(async () => {
  const sbx = await Sandbox.create({ timeoutMs: 120_000 })
  const other = await Sandbox.create({ timeoutMs: 120_000 })
  await sbx.commands.run('mkdir -p /tmp/www && echo served-from-inside > /tmp/www/index.html')
  await sbx.commands.run('cd /tmp/www && exec python3 -m http.server 8000 --bind 127.0.0.1', { background: true })
  const get = (token) => fetch(process.env.E2B_SANDBOX_URL + '/index.html', {
    headers: Object.assign({ 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000' },
      token ? { 'E2B-Traffic-Access-Token': token } : {}),
  })
  let res
  for (let i = 0; i < 200; i++) {
    res = await get(sbx.trafficAccessToken)
    if (res.status === 200) break
    await sleep(100)
  }
  see('withToken', { status: res.status, body: await res.text() })
  see('noToken', (await get('')).status)
  see('othersToken', (await get(other.trafficAccessToken)).status)
  see('envdToken', (await get(sbx.envdAccessToken)).status)

  // By name, PORT-ID.DOMAIN (e2b.domain), as getHost gives it: sent to
  // serve's address with that Host.
  const byName = (host, headers, path = '/index.html') => new Promise((resolve, reject) => {
    const api = new URL(process.env.E2B_API_URL)
    const req = http.request({ host: api.hostname, port: api.port, path, headers: Object.assign({ Host: host }, headers) }, (res) => {
      let body = ''
      res.on('data', (d) => { body += d })
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('error', reject)
    req.end()
  })
  see('getHost', sbx.getHost(8000))
  see('byName', await byName(sbx.getHost(8000), { 'E2B-Traffic-Access-Token': sbx.trafficAccessToken }))
  see('byNameNoToken', (await byName(sbx.getHost(8000), {})).status)
  see('envdByName', (await byName(sbx.getHost(49983), { 'X-Access-Token': sbx.envdAccessToken }, '/health')).status)
  await sbx.kill()
  // other is left running: serve's stop ends it.
})
