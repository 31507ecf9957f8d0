// Makes the expected outputs of test/test_tokenize.sh from its inputs (docs.jsonl, text/*.txt,
// llama3.jsonl) with an implementation independent of ./tokenize: GPT-2 ids from the npm package
// gpt-tokenizer, shards cut as llm.c's dev/data/fineweb.py cuts them. Also writes the same documents as
// ./tokenize --records input (docs.rec) and as two FineWeb-shaped parquet files (hyparquet-writer), and
// for Llama-3's pre-tokenizer a rank file of the cl100k_base tokens (same pattern) that the llama3
// documents need, with their ids. Run once, from the repository root:
//   npm install --prefix build/npm-test gpt-tokenizer@4.0.0 hyparquet-writer@0.17.0
//   node test/data/tokenize/make_expected.mjs build/npm-test
import fs from 'fs'
import path from 'path'
import { createRequire } from 'module'
import { pathToFileURL } from 'url'

const prefix = path.resolve(process.argv[2] ?? 'build/npm-test', 'node_modules')
const require = createRequire(prefix + '/')
const r50k = require(`${prefix}/gpt-tokenizer/cjs/encoding/r50k_base.js`)
const cl100k = require(`${prefix}/gpt-tokenizer/cjs/encoding/cl100k_base.js`)
const { parquetWriteFile } = await import(pathToFileURL(`${prefix}/hyparquet-writer/src/node.js`).href)
const dir = 'test/data/tokenize'
const expected = `${dir}/expected`
fs.mkdirSync(expected, { recursive: true })
fs.mkdirSync(`${dir}/parquet`, { recursive: true })

// documents of a JSON-lines file: blank lines are none
const jsonl = file => fs.readFileSync(file, 'utf8').split('\n').filter(l => l.trim() !== '').map(l => JSON.parse(l).text)

// llm.c's shard cutting: fill a shard while the next document fits (strictly); else complete the shard with
// what fits and start the next with the rest (fineweb.py fails on a rest longer than a shard)
function cut(docs, shardTokens) {
  const shards = []
  let buf = []
  for (const doc of docs) {
    if (buf.length + doc.length < shardTokens) { buf.push(...doc); continue }
    const fit = shardTokens - buf.length
    shards.push([...buf, ...doc.slice(0, fit)])
    buf = doc.slice(fit)
    if (buf.length > shardTokens) throw new Error('a document longer than a shard')
  }
  if (buf.length > 0) shards.push(buf)
  return shards
}

function writeShards(prefixPath, shards, bytes) {
  shards.forEach((tokens, i) => {
    const b = Buffer.alloc(1024 + bytes * tokens.length)
    b.writeInt32LE(bytes === 2 ? 20240520 : 20240801, 0)
    b.writeInt32LE(bytes === 2 ? 1 : 7, 4)
    b.writeInt32LE(tokens.length, 8)
    tokens.forEach((t, j) => bytes === 2 ? b.writeUInt16LE(t, 1024 + 2 * j) : b.writeUInt32LE(t, 1024 + 4 * j))
    fs.writeFileSync(`${prefixPath}_${i === 0 ? 'val' : 'train'}_${String(i).padStart(6, '0')}.bin`, b)
  })
}

const gpt2 = text => [50256, ...r50k.encode(text, { disallowedSpecial: new Set() })]

// docs.jsonl: the shard size puts the first shard's end exactly at a document's end (fineweb.py's
// "does not fit" branch with nothing left over), and every later boundary inside a document
const docs = jsonl(`${dir}/docs.jsonl`)
const docTokens = docs.map(gpt2)
let shardTokens = 0, m = 0
while (shardTokens < 1000 || shardTokens <= Math.max(...docTokens.map(d => d.length))) shardTokens += docTokens[m++].length
writeShards(`${expected}/docs`, cut(docTokens, shardTokens), 2)
// the val split by documents (--val_docs 5): the first 5 documents, then shards as above
const valDocs = 5
writeShards(`${expected}/valdocs`, [docTokens.slice(0, valDocs).flat(), ...cut(docTokens.slice(valDocs), shardTokens)], 2)

// text/*.txt: each file a document
const textFiles = fs.readdirSync(`${dir}/text`).sort().map(f => fs.readFileSync(`${dir}/text/${f}`, 'utf8'))
const textTokens = textFiles.map(gpt2)
const textShard = Math.max(...textTokens.map(d => d.length)) + 50
writeShards(`${expected}/text`, cut(textTokens, textShard), 2)

// --records input: uint32 little-endian byte count, then the UTF-8 bytes
fs.writeFileSync(`${dir}/docs.rec`, Buffer.concat(docs.flatMap(t => {
  const b = Buffer.from(t, 'utf8'), n = Buffer.alloc(4)
  n.writeUInt32LE(b.length)
  return [n, b]
})))

// the documents as two FineWeb-shaped parquet files: snappy with row groups of 5, and uncompressed
const parts = [docs.slice(0, 17), docs.slice(17)]
parts.forEach((texts, f) => parquetWriteFile({
  filename: `${dir}/parquet/00${f}_00000.parquet`,
  columnData: [
    { name: 'text', data: texts, type: 'STRING' },
    { name: 'id', data: texts.map((_, i) => `<urn:uuid:${f}-${i}>`), type: 'STRING' },
    { name: 'token_count', data: texts.map(t => BigInt(gpt2(t).length - 1)), type: 'INT64' },
  ],
  rowGroupSize: 5,
  codec: f === 0 ? 'SNAPPY' : 'UNCOMPRESSED',
}))

// Llama-3: split with its pattern (\s as Unicode White_Space, as tiktoken's regex has it), BPE with the
// cl100k_base ranks as tiktoken does, noting every token formed on the way
const ws = String.raw`\t-\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000`
const llama3Split = new RegExp(String.raw`'(?:[sS\u017f]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^${ws}\p{L}\p{N}]+[\r\n]*|[${ws}]*[\r\n]+|[${ws}]+(?![^${ws}])|[${ws}]+`, 'gu')
const ranks = new Map()
for (const line of fs.readFileSync(`${prefix}/gpt-tokenizer/data/cl100k_base.tiktoken`, 'utf8').split('\n')) {
  const [b64, rank] = line.split(' ')
  if (b64) ranks.set(Buffer.from(b64, 'base64').toString('latin1'), Number(rank))
}
const used = new Set()
for (let b = 0; b < 256; b++) used.add(String.fromCharCode(b))
function bpe(piece) { // piece: a byte string (latin1)
  if (ranks.has(piece)) { used.add(piece); return [ranks.get(piece)] }
  let parts = [...piece]
  for (;;) {
    let best = -1, bestRank = Infinity
    for (let i = 0; i + 1 < parts.length; i++) {
      const r = ranks.get(parts[i] + parts[i + 1])
      if (r !== undefined && r < bestRank) { bestRank = r; best = i }
    }
    if (best < 0) break
    parts.splice(best, 2, parts[best] + parts[best + 1])
    used.add(parts[best])
  }
  return parts.map(p => ranks.get(p))
}
const llama3Docs = jsonl(`${dir}/llama3.jsonl`)
const llama3Ids = llama3Docs.map(text => {
  const ids = (text.match(llama3Split) ?? []).flatMap(p => bpe(Buffer.from(p, 'utf8').toString('latin1')))
  if ((text.match(llama3Split) ?? []).join('') !== text) throw new Error('the split lost characters')
  const reference = cl100k.encode(text, { disallowedSpecial: new Set() })
  if (ids.join() !== reference.join()) console.error(`note: gpt-tokenizer's cl100k differs on ${JSON.stringify(text.slice(0, 40))} (its regex is not tiktoken's)`)
  return ids
})
// the rank file: the tokens used, in cl100k order, numbered from 0 (relative order keeps the merges)
const kept = [...used].sort((a, b) => ranks.get(a) - ranks.get(b))
const newId = new Map(kept.map((t, i) => [ranks.get(t), i]))
fs.writeFileSync(`${dir}/llama3_ranks.tiktoken`, kept.map((t, i) => `${Buffer.from(t, 'latin1').toString('base64')} ${i}\n`).join(''))
writeShards(`${expected}/llama3`, [llama3Ids.flatMap(ids => [128000, ...ids.map(id => newId.get(id))])], 4)

fs.writeFileSync(`${expected}/shard_tokens.txt`, `docs ${shardTokens}\nvaldocs ${valDocs}\ntext ${textShard}\n`)
console.log(`docs: ${docs.length} documents, ${docTokens.flat().length} tokens, shards of ${shardTokens}; ` +
  `text: ${textFiles.length} files, shards of ${textShard}; llama3: ${llama3Docs.length} documents, ${kept.length} ranks`)
