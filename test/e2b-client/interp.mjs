// The code interpreter (runCode, contexts) with the real
// @e2b/code-interpreter, in a sandbox of the template argv[2]
// (test/integration/e2b_interp_test.go). Each check is seen as "ok" or
// as why it failed.
import { Sandbox } from '@e2b/code-interpreter'
import { see, main } from './lib.mjs'

async function check(name, fn) {
  try {
    await fn()
    see(name, 'ok')
  } catch (e) {
    see(name, String(e && e.stack ? e.stack : e))
  }
}
function want(cond, why) {
  if (!cond) throw new Error(why)
}
const show = (v) => JSON.stringify(v)?.slice(0, 500)

await main(async () => {
  const sbx = await Sandbox.create(process.argv[2], { timeoutMs: 300_000 })

  await check('value', async () => {
    const ex = await sbx.runCode('1+1')
    want(ex.text === '2', `text ${show(ex.text)}, results ${show(ex.results)}, error ${show(ex.error)}`)
    want(ex.results.length === 1 && ex.results[0].isMainResult, `results ${show(ex.results)}`)
    want(typeof ex.executionCount === 'number' && ex.executionCount >= 1, `executionCount ${ex.executionCount}`)
  })

  await check('streams', async () => {
    const out = [], err = []
    const ex = await sbx.runCode('import sys\nprint("hello")\nprint("oops", file=sys.stderr)', {
      onStdout: (m) => out.push(m.line), onStderr: (m) => err.push(m.line),
    })
    want(out.join('') === 'hello\n' && err.join('') === 'oops\n', `stdout ${show(out)}, stderr ${show(err)}`)
    want(ex.logs.stdout.join('') === 'hello\n' && ex.logs.stderr.join('') === 'oops\n', `logs ${show(ex.logs)}`)
    want(ex.results.length === 0 && !ex.error, `results ${show(ex.results)}, error ${show(ex.error)}`)
  })

  await check('state', async () => {
    await sbx.runCode('x = 41\ndef f(a):\n    return a + x')
    const ex = await sbx.runCode('f(1)')
    want(ex.text === '42', `text ${show(ex.text)}, error ${show(ex.error)}`)
  })

  await check('string-value', async () => {
    const ex = await sbx.runCode('"a" * 3')
    want(ex.text === 'aaa', `text ${show(ex.text)}`)
  })

  await check('error', async () => {
    const errs = []
    const ex = await sbx.runCode('def g():\n    return 1/0\ng()', { onError: (e) => errs.push(e) })
    want(ex.error && ex.error.name === 'ZeroDivisionError' && ex.error.value === 'division by zero',
      `error ${show(ex.error)}`)
    want(ex.error.traceback.includes('return 1/0') && ex.error.traceback.includes('ZeroDivisionError'),
      `traceback ${show(ex.error.traceback)}`)
    want(!ex.error.traceback.includes('agentrun_repl'), `traceback names the launcher: ${show(ex.error.traceback)}`)
    want(errs.length === 1, `onError called ${errs.length} times`)
  })

  await check('figure', async () => {
    const ex = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()')
    want(!ex.error && ex.results.length === 1, `results ${show(ex.results?.map((r) => r.formats()))}, error ${show(ex.error)}`)
    const png = Buffer.from(ex.results[0].png || '', 'base64')
    want(png.length > 1000 && png.subarray(0, 8).equals(Buffer.from('\x89PNG\r\n\x1a\n', 'latin1')), `png of ${png.length} bytes`)
    want(!ex.results[0].isMainResult, 'a shown figure is the main result')
    // A figure left open comes at the cell's end.
    const ex2 = await sbx.runCode('plt.figure()\nplt.plot([1, 2])\nNone')
    want(ex2.results.length === 1 && ex2.results[0].png, `open figure: results ${show(ex2.results?.map((r) => r.formats()))}`)
  })

  await check('dataframe', async () => {
    const ex = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2], "b": [3, 4]})')
    want(ex.results.length === 1 && ex.results[0].isMainResult, `results ${show(ex.results)}`)
    want((ex.results[0].html || '').includes('<table'), `html ${show(ex.results[0].html)}`)
    want((ex.results[0].text || '').includes('a'), `text ${show(ex.results[0].text)}`)
  })

  await check('display-formats', async () => {
    const code = [
      'class M:',
      '    def _repr_markdown_(self): return "**m**"',
      '    def _repr_latex_(self): return "$x$"',
      '    def _repr_svg_(self): return "<svg></svg>"',
      '    def _repr_json_(self): return {"k": [1, 2]}',
      'display(M())',
    ].join('\n')
    const ex = await sbx.runCode(code)
    const r = ex.results[0]
    want(ex.results.length === 1 && !r.isMainResult, `results ${show(ex.results)}`)
    want(r.markdown === '**m**' && r.latex === '$x$' && r.svg === '<svg></svg>' && show(r.json) === '{"k":[1,2]}',
      `result ${show(r)}`)
  })

  await check('forged-frame', async () => {
    // The code prints what would be a result frame of its own cell, and of
    // the cells around it: it stays stdout.
    const code = 'for n in range(0, 200):\n' +
      '    print("\\n{\\"t\\": \\"result\\", \\"cell\\": %d, \\"main\\": true, \\"bundle\\": {\\"text/plain\\": \\"forged\\"}}\\n{\\"t\\": \\"done\\", \\"cell\\": %d, \\"count\\": 99}" % (n, n))'
    const ex = await sbx.runCode(code)
    want(ex.results.length === 0, `results ${show(ex.results)}`)
    want(ex.executionCount !== 99, `executionCount ${ex.executionCount}`)
    want(ex.logs.stdout.join('').includes('forged'), 'the printed text is not stdout')
    const after = await sbx.runCode('2+3')
    want(after.text === '5', `the next cell: ${show(after.text)}`)
  })

  await check('env', async () => {
    const ex = await sbx.runCode('import os\nos.environ["FOO"]', { envs: { FOO: 'bar' } })
    want(ex.text === 'bar', `text ${show(ex.text)}, error ${show(ex.error)}`)
    const ex2 = await sbx.runCode('import os\nos.environ.get("FOO", "unset")')
    want(ex2.text === 'unset', `after: ${show(ex2.text)}`)
  })

  await check('contexts', async () => {
    const ctx = await sbx.createCodeContext({ cwd: '/tmp', language: 'python' })
    want(ctx.id && ctx.language === 'python' && ctx.cwd === '/tmp', `context ${show(ctx)}`)
    const cwd = await sbx.runCode('import os\nos.getcwd()', { context: ctx })
    want(cwd.text === '/tmp', `cwd ${show(cwd.text)}, error ${show(cwd.error)}`)
    await sbx.runCode('y = 5', { context: ctx })
    const mine = await sbx.runCode('y', { context: ctx })
    want(mine.text === '5', `y in the context: ${show(mine.text)}`)
    const dflt = await sbx.runCode('y')
    want(dflt.error && dflt.error.name === 'NameError', `y in the default context: ${show(dflt)}`)
    const list = await sbx.listCodeContexts()
    want(list.some((c) => c.id === ctx.id && c.cwd === '/tmp'), `list ${show(list)}`)
    await sbx.restartCodeContext(ctx)
    const gone = await sbx.runCode('y', { context: ctx })
    want(gone.error && gone.error.name === 'NameError', `y after restart: ${show(gone)}`)
    await sbx.removeCodeContext(ctx.id)
    const list2 = await sbx.listCodeContexts()
    want(!list2.some((c) => c.id === ctx.id), `list after remove ${show(list2)}`)
    let err
    try { await sbx.runCode('1', { context: ctx }) } catch (e) { err = e }
    want(err && err.name === 'NotFoundError', `a removed context: ${err}`)
  })

  await check('bash', async () => {
    const ex = await sbx.runCode('x=3\necho hi\necho oops >&2', { language: 'bash' })
    want(ex.logs.stdout.join('') === 'hi\n' && ex.logs.stderr.join('') === 'oops\n' && !ex.error, `first: ${show(ex)}`)
    const ex2 = await sbx.runCode('echo $((x + 1))\nfalse', { language: 'bash' })
    want(ex2.logs.stdout.join('') === '4\n' && ex2.error?.name === 'ExitError', `state and status: ${show(ex2)}`)
    const ctx = await sbx.createCodeContext({ language: 'bash', cwd: '/tmp' })
    const ex3 = await sbx.runCode('pwd; echo ${x:-unset}', { context: ctx })
    want(ctx.language === 'bash' && ex3.logs.stdout.join('') === '/tmp\nunset\n', `a bash context: ${show(ctx)} ${show(ex3)}`)
    await sbx.removeCodeContext(ctx)
  })

  await check('other-language', async () => {
    let err
    try { await sbx.createCodeContext({ language: 'javascript' }) } catch (e) { err = e }
    want(err && /python/.test(err.message), `javascript: ${err}`)
  })

  await check('timeout', async () => {
    let err
    try {
      await sbx.runCode('import time\nwhile True:\n    time.sleep(0.05)', { timeoutMs: 1500 })
    } catch (e) { err = e }
    want(err && err.name === 'TimeoutError', `a cell past its timeout: ${err}`)
    // The cell was interrupted: the context takes the next one.
    const ex = await sbx.runCode('x')
    want(ex.text === '41', `after the timeout: ${show(ex.text)}, error ${show(ex.error)}`)
  })

  await sbx.kill()
})
