#!/usr/bin/env bash
# Downloads a FineWeb or FineWeb-Edu sample from the Hugging Face hub and tokenizes it into llm.c shards:
# DIR/NAME_val_000000.bin, DIR/NAME_train_000001.bin, ... of 1e8 tokens (the last one shorter), the same
# bytes that llm.c's dev/data/fineweb.py writes for the same documents: the sample's parquet files in name
# order (as the datasets library lists them), their rows in order, each document the separator token and
# then its tokens, the first shard val and the rest train. Both steps resume: the download with curl -C -,
# the tokenization from the state ./tokenize keeps after each complete shard. Rerun the same command.
#
# It needs, beyond this repository: curl, node >= 18 and the npm packages hyparquet and
# hyparquet-compressors (to read parquet), and g++ and make to build ./tokenize. `--install` installs them.
#
#   bash dev/data/fineweb.sh [-t classic|edu] [-v 10B|100B|350B] [-m gpt2|llama3] [-s SHARD_TOKENS] [-o DIR]
#                            [--tokenizer FILE] [-j READERS] [--files N] [--local PARQUET_DIR]
#   bash dev/data/fineweb.sh --install
#
#   -t          classic (HuggingFaceFW/fineweb, NAME fineweb) or edu (HuggingFaceFW/fineweb-edu,
#               NAME edu_fineweb); default classic
#   -v          the sample: 10B, 100B or 350B GPT-2 tokens (sample/10BT, ...); default 10B
#   -m          gpt2 (uint16 shards) or llama3 (uint32 shards; needs --tokenizer); default gpt2
#   -s          tokens per shard; default 100000000
#   -o          output directory; default dev/data/fineweb10B, dev/data/edu_fineweb100B, ... as llm.c's
#   --tokenizer the rank file: data/r50k_base.tiktoken for gpt2; for llama3 Llama-3's tokenizer.model
#   -j          parallel parquet readers; default a quarter of the cores (./tokenize takes all of them)
#   --files N   only the first N parquet files of the sample (a smaller data set, quicker to try)
#   --local D   no download: tokenize the parquet files in directory D (name order) instead
# HF_TOKEN, if set, is sent to the hub (not needed: the data sets are public); HF_ENDPOINT replaces
# https://huggingface.co (a mirror).
set -euo pipefail
cd "$(dirname "$0")/../.."

NPM_PREFIX=build/npm-fineweb
NPM_PACKAGES="hyparquet@1.31.5 hyparquet-compressors@1.1.2"
HUB=${HF_ENDPOINT:-https://huggingface.co}

die() { echo "error: $*" >&2; exit 1; }

install() {
    local apt=() sudo=()
    command -v curl >/dev/null || apt+=(curl)
    command -v node >/dev/null || apt+=(nodejs)
    command -v npm >/dev/null || apt+=(npm)
    command -v make >/dev/null || apt+=(make)
    command -v g++ >/dev/null || apt+=(g++)
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    if [ ${#apt[@]} -gt 0 ]; then
        "${sudo[@]}" apt-get update
        DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y --no-install-recommends "${apt[@]}"
    fi
    # shellcheck disable=SC2086
    npm install --silent --no-save --prefix "$NPM_PREFIX" $NPM_PACKAGES
    make tokenize
}

# ----------------------------------------------------------------------------
# arguments

type=classic; version=10B; model=gpt2; shard_tokens=100000000; dir=""; tokenizer=""; local_dir=""
max_files=0; readers=$(( $(nproc) / 4 > 0 ? $(nproc) / 4 : 1 ))
want_value() { [ $# -ge 2 ] || die "$1 needs a value (see the top of $0)"; }
while [ $# -gt 0 ]; do
    case $1 in
        --install) install; exit 0 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -t) want_value "$@"; type=$2; shift 2 ;;
        -v) want_value "$@"; version=$2; shift 2 ;;
        -m) want_value "$@"; model=$2; shift 2 ;;
        -s) want_value "$@"; shard_tokens=$2; shift 2 ;;
        -o) want_value "$@"; dir=$2; shift 2 ;;
        -j) want_value "$@"; readers=$2; shift 2 ;;
        --tokenizer) want_value "$@"; tokenizer=$2; shift 2 ;;
        --files) want_value "$@"; max_files=$2; shift 2 ;;
        --local) want_value "$@"; local_dir=$2; shift 2 ;;
        *) die "unknown argument '$1' (see the top of $0, or --help)" ;;
    esac
done
case $type in
    classic) repo=HuggingFaceFW/fineweb; name=fineweb ;;
    edu) repo=HuggingFaceFW/fineweb-edu; name=edu_fineweb ;;
    *) die "-t is classic or edu, got '$type'" ;;
esac
case $version in
    10B|100B|350B) ;;
    *) die "-v is 10B, 100B or 350B, got '$version'" ;;
esac
case $model in
    gpt2|gpt-2) vocab=gpt2; tokenizer=${tokenizer:-data/r50k_base.tiktoken} ;;
    llama3|llama-3) vocab=llama3
        [ -n "$tokenizer" ] || die "-m llama3 needs --tokenizer FILE: Llama-3's tiktoken rank file (original/tokenizer.model of meta-llama/Meta-Llama-3-8B, a gated download)" ;;
    *) die "-m is gpt2 or llama3, got '$model'" ;;
esac
[[ $readers =~ ^[1-9][0-9]*$ ]] || die "-j wants a positive whole number, got '$readers'"
[[ $max_files =~ ^[0-9]+$ ]] || die "--files wants a whole number, got '$max_files'"
[ -f "$tokenizer" ] || die "tokenizer file $tokenizer does not exist"
dir=${dir:-dev/data/${name}${version}}
if [ -n "$local_dir" ]; then
    [ -d "$local_dir" ] || die "--local $local_dir is not a directory"
    parquet=$local_dir
else
    parquet=$dir/parquet
fi

# ----------------------------------------------------------------------------
# what it needs

missing=()
[ -n "$local_dir" ] || command -v curl >/dev/null || missing+=(curl)
if ! command -v node >/dev/null; then
    missing+=(node)
elif [ "$(node -p 'process.versions.node.split(".")[0]')" -lt 18 ]; then
    missing+=("node >= 18 (this is $(node --version))")
fi
for p in $NPM_PACKAGES; do [ -d "$NPM_PREFIX/node_modules/${p%@*}" ] || missing+=("npm ${p%@*}"); done
if [ ! -x tokenize ] || [ tools/tokenize.cpp -nt tokenize ]; then
    { command -v make >/dev/null && command -v g++ >/dev/null; } || missing+=(make g++)
fi
[ ${#missing[@]} -eq 0 ] || die "missing: ${missing[*]}; install with: bash $0 --install"
! command -v make >/dev/null || make -s tokenize  # rebuilds it if a source changed

# the parquet reader: writes the text column of the files, from row SKIP on, as ./tokenize --records
# reads it (uint32 little-endian byte count, then the UTF-8 bytes), with READERS worker threads reading
# row groups in parallel and the main thread writing them in order. `count` prints the total rows.
cat > "$NPM_PREFIX/parquet_records.mjs" <<'EOF'
import { Worker, isMainThread, parentPort } from 'worker_threads'
import { asyncBufferFromFile, parquetMetadataAsync, parquetRead } from 'hyparquet'
import { compressors } from 'hyparquet-compressors'

async function open(path) {
  const file = await asyncBufferFromFile(path)
  const metadata = await parquetMetadataAsync(file)
  if (!metadata.schema.some(e => e.name === 'text')) throw new Error(`${path} has no column "text"`)
  return { file, metadata }
}

if (!isMainThread) {
  const files = new Map()
  parentPort.on('message', async ({ seq, path, rowStart, rowEnd }) => {
    if (!files.has(path)) files.set(path, open(path))
    const { file, metadata } = await files.get(path)
    let texts = []
    await parquetRead({ file, metadata, compressors, columns: ['text'], rowStart, rowEnd,
      parsers: { stringFromBytes: bytes => bytes }, // the UTF-8 bytes as they are: no decoding
      onComplete: rows => { texts = rows.map(r => r[0]) } })
    const out = new Uint8Array(texts.reduce((n, t) => n + 4 + t.length, 0))
    const view = new DataView(out.buffer)
    let at = 0
    for (const [i, t] of texts.entries()) {
      if (!(t instanceof Uint8Array)) throw new Error(`${path}: row ${rowStart + i} has no text`)
      view.setUint32(at, t.length, true)
      out.set(t, at + 4)
      at += 4 + t.length
    }
    parentPort.postMessage({ seq, out }, [out.buffer])
  })
} else {
  const [mode, skipArg, readersArg, ...paths] = process.argv.slice(2)
  const fail = e => { console.error(`error: parquet reader: ${e.message ?? e}`); process.exit(1) }
  process.on('unhandledRejection', fail)
  process.stdout.on('error', e => process.exit(e.code === 'EPIPE' ? 1 : fail(e)))
  const opened = []
  for (const path of paths) opened.push(await open(path).catch(e => fail(`${path}: ${e.message}`)))
  if (mode === 'count') {
    console.log(opened.reduce((n, f) => n + Number(f.metadata.num_rows), 0))
    process.exit(0)
  }
  // one task per row group, from row skip of the files taken together
  const tasks = []
  let skip = Number(skipArg) // rows still to skip
  opened.forEach(({ metadata }, i) => {
    let start = 0
    for (const group of metadata.row_groups) {
      const rows = Number(group.num_rows)
      if (skip < rows) tasks.push({ path: paths[i], rowStart: start + skip, rowEnd: start + rows })
      skip = Math.max(0, skip - rows)
      start += rows
    }
  })
  const readers = Array.from({ length: Number(readersArg) }, () => new Worker(new URL(import.meta.url)))
  const done = new Map()
  let sent = 0, wake = null
  const send = written => {
    for (; sent < tasks.length && sent - written < 8 * readers.length; sent++) {
      readers[sent % readers.length].postMessage({ seq: sent, ...tasks[sent] })
    }
  }
  for (const r of readers) {
    r.on('message', ({ seq, out }) => { done.set(seq, out); if (wake) wake() })
    r.on('error', fail)
  }
  send(0)
  for (let written = 0; written < tasks.length;) {
    if (!done.has(written)) { await new Promise(resolve => { wake = resolve }); continue }
    const out = done.get(written)
    done.delete(written++)
    send(written)
    if (!process.stdout.write(out)) await new Promise(resolve => process.stdout.once('drain', resolve))
  }
  for (const r of readers) r.terminate()
}
EOF

# ----------------------------------------------------------------------------
# the file list and the download

mkdir -p "$dir" "$parquet"
auth=()
[ -z "${HF_TOKEN:-}" ] || auth=(-H "Authorization: Bearer $HF_TOKEN")

# the hub's listing of sample/<version>T, one "path size sha256" line per parquet file, in name order;
# kept, so that a rerun works on the same files
list_files() {
    local url="$HUB/api/datasets/$repo/tree/main/sample/${version}T"
    : > "$parquet/files.tmp"
    while [ -n "$url" ]; do # the listing comes in pages; the Link header names the next one
        curl -sSf --retry 5 "${auth[@]}" -D "$parquet/headers.tmp" -o "$parquet/page.tmp" "$url" \
            || die "cannot list $url"
        node -e '
            const entries = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
            for (const e of entries) {
                if (e.type === "file" && e.path.endsWith(".parquet")) console.log(`${e.path} ${e.size} ${e.lfs ? e.lfs.oid : "-"}`);
            }' "$parquet/page.tmp" >> "$parquet/files.tmp"
        url=$(tr -d '\r' < "$parquet/headers.tmp" | sed -n 's/^[Ll]ink: .*<\([^>]*\)>; *rel="next".*/\1/p')
    done
    [ -s "$parquet/files.tmp" ] || die "$repo has no parquet files under sample/${version}T"
    LC_ALL=C sort "$parquet/files.tmp" > "$parquet/files.txt"
    rm -f "$parquet/files.tmp" "$parquet/page.tmp" "$parquet/headers.tmp"
}

# downloads one file, resuming a partial download, and checks its size and SHA-256
download() {
    local path=$1 size=$2 sha=$3 out=$4 have tries=0
    while :; do
        have=$(stat -c %s "$out.part" 2>/dev/null || echo 0)
        [ "$have" -lt "$size" ] || break
        tries=$((tries + 1))
        [ $tries -le 20 ] || die "giving up on $HUB/datasets/$repo/resolve/main/$path after 20 tries"
        curl -fL -# -C - --connect-timeout 30 --speed-limit 100000 --speed-time 60 "${auth[@]}" \
            -o "$out.part" "$HUB/datasets/$repo/resolve/main/$path" || sleep $((tries < 10 ? 2 * (tries - 1) : 30))
    done
    [ "$have" -eq "$size" ] || { rm -f "$out.part"; die "$path: got $have bytes, the hub says $size; deleted, rerun"; }
    if [ "$sha" != - ] && [ "$(sha256sum "$out.part" | cut -d' ' -f1)" != "$sha" ]; then
        rm -f "$out.part"
        die "$path: SHA-256 differs from the hub's; deleted, rerun"
    fi
    mv "$out.part" "$out"
}

files=()
if [ -n "$local_dir" ]; then
    LC_COLLATE=C # name order as Python sorts names
    for f in "$local_dir"/*.parquet; do [ ! -f "$f" ] || files+=("$f"); done
    [ ${#files[@]} -gt 0 ] || die "--local $local_dir holds no .parquet files"
else
    [ -s "$parquet/files.txt" ] || list_files
    n=0; total=$(wc -l < "$parquet/files.txt")
    [ "$max_files" -eq 0 ] || [ "$max_files" -ge "$total" ] || total=$max_files
    while read -r path size sha; do
        [ "$max_files" -eq 0 ] || [ $n -lt "$max_files" ] || break
        n=$((n + 1))
        out=$parquet/$(basename "$path")
        files+=("$out")
        [ -f "$out" ] && continue
        echo "fineweb: downloading $n/$total: $path ($((size / 1000000)) MB)"
        download "$path" "$size" "$sha" "$out"
    done < "$parquet/files.txt"
fi
[ "$max_files" -eq 0 ] || [ "$max_files" -ge ${#files[@]} ] || files=("${files[@]:0:$max_files}")

# ----------------------------------------------------------------------------
# tokenization: the parquet reader pipes the documents into ./tokenize

settings="$repo sample/${version}T files ${#files[@]} vocab $vocab shard_tokens $shard_tokens"
out=$dir/$name
if [ -f "$out.done" ] && [ "$(cat "$out.done")" = "$settings" ]; then
    echo "fineweb: $out shards are already complete ($settings); delete $out.done to redo them"
    exit 0
fi
rm -f "$out.done"
docs=$(node "$NPM_PREFIX/parquet_records.mjs" count 0 1 "${files[@]}")
first=0
if [ -f "$out.state" ]; then
    first=$(awk '$1 == "docs" {print $2}' "$out.state")
else # a fresh start: no shards of an earlier run may stay behind
    rm -f "${out}"_val_*.bin "${out}"_train_*.bin
fi
echo "fineweb: tokenizing ${#files[@]} parquet files, $docs documents, into ${out}_*.bin"
node "$NPM_PREFIX/parquet_records.mjs" records "$first" "$readers" "${files[@]}" \
    | ./tokenize -o "$out" -s "$shard_tokens" --vocab "$vocab" -t "$tokenizer" --records \
                 --resume --first-doc "$first" --total-docs "$docs" -
echo "$settings" > "$out.done"
echo "fineweb: done. Train on it with"
echo "  ./train_gpt_sparse -i '${out}_train_*.bin' -j '${out}_val_*.bin'$([ $vocab = llama3 ] && echo ' --vocab 128256')"
echo "fineweb: the parquet files in $parquet are no longer needed by the shards ($(du -sh "$parquet" | cut -f1))"
