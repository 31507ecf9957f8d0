// Makes test/data/eval/hellaswag_fixture.bin, the eval file that ./tokenize --hellaswag must write for
// hellaswag_fixture.jsonl, with an implementation independent of it: GPT-2 ids from the npm package
// gpt-tokenizer, the layout of docs/MODEL.md ("Multiple-choice eval file") written out here. Each context
// is <|endoftext|> then encode(ctx), each ending encode(" " + ending). Run once, from the repository root:
//   npm install --prefix build/npm-test gpt-tokenizer@4.0.0
//   node test/data/eval/make_expected.mjs build/npm-test
import fs from 'fs'
import path from 'path'
import { createRequire } from 'module'

const prefix = path.resolve(process.argv[2] ?? 'build/npm-test', 'node_modules')
const require = createRequire(prefix + '/')
const r50k = require(`${prefix}/gpt-tokenizer/cjs/encoding/r50k_base.js`)
const dir = 'test/data/eval'
const examples = fs.readFileSync(`${dir}/hellaswag_fixture.jsonl`, 'utf8').split('\n').filter(l => l.trim() !== '')
  .map(l => JSON.parse(l))
const K = examples[0].endings.length
const words = [20261124, 1, examples.length, K, 50257]
while (words.length < 256) words.push(0)
for (const e of examples) {
  words.push(e.label)
  const lists = [[50256, ...r50k.encode(e.ctx)], ...e.endings.map(s => r50k.encode(' ' + s))]
  for (const l of lists) words.push(l.length, ...l)
}
const out = Buffer.alloc(4 * words.length)
words.forEach((w, i) => out.writeInt32LE(w, 4 * i))
fs.writeFileSync(`${dir}/hellaswag_fixture.bin`, out)
console.log(`${dir}/hellaswag_fixture.bin: ${examples.length} examples, ${out.length} bytes`)
