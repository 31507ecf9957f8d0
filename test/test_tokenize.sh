#!/usr/bin/env bash
# Tests ./tokenize and the parts of dev/data/fineweb.sh that need no network. The expected shards in
# test/data/tokenize/expected were made by an independent implementation (make_expected.mjs: the npm
# package gpt-tokenizer, and llm.c's fineweb.py shard cutting); besides those exact bytes, the structure
# (headers, separators, shard sizes, the val/train split) is checked here from the token streams. Also:
# the same bytes from every input format and thread count, resuming after --max-shards and after kill -9,
# one-line errors for bad input, Llama-3's pre-tokenizer, and fineweb.sh on local parquet files (when its
# node packages are installed: bash dev/data/fineweb.sh --install). Run from anywhere; needs ./tokenize.
set -u
cd "$(dirname "$0")/.." || exit 1
TEST_NAME=test_tokenize
. test/check.sh
hub=""  # the stand-in hub's process, while it runs
trap '[ -z "$hub" ] || kill $hub 2>/dev/null; rm -rf "$work"' EXIT
D=test/data/tokenize
E=$D/expected
S=$(awk '$1 == "docs" {print $2}' $E/shard_tokens.txt)          # shard size for docs.jsonl
K=$(awk '$1 == "valdocs" {print $2}' $E/shard_tokens.txt)       # --val-docs
ST=$(awk '$1 == "text" {print $2}' $E/shard_tokens.txt)         # shard size for text/*.txt
DOCS=$(grep -cv '^[[:space:]]*$' $D/docs.jsonl)                 # blank lines are not documents

# same_shards EXPECTED_PREFIX PREFIX: the same shard files, byte for byte, and no others
same_shards() {
    local a b
    a=$(cd "$(dirname "$1")" && ls "$(basename "$1")"_*.bin | sed "s|^$(basename "$1")||")
    b=$(cd "$(dirname "$2")" && ls "$(basename "$2")"_*.bin 2>/dev/null | sed "s|^$(basename "$2")||")
    [ "$a" = "$b" ] || { echo "shards $b, expected $a"; return 1; }
    for s in $a; do cmp -s "$1$s" "$2$s" || { echo "$2$s differs from $1$s"; return 1; }; done
}
shard_list() { ls "$1"_val_000000.bin; ls "$1"_train_*.bin 2>/dev/null | sort; }  # in shard order
tokens() { od -An -v -tu"$2" -j1024 "$1" | tr -s ' \n' '\n\n' | sed '/^$/d'; }  # tokens FILE BYTES
header() { od -An -tu4 -N12 "$1" | tr -s ' ' | sed 's/^ //'; }
tok() { ./tokenize "$@" > /dev/null 2>&1; }

# a Llama-3 rank file: the cl100k_base tokens (same pre-tokenizer) that llama3.jsonl needs, padded to
# Llama-3's 128000 ranks with 3-byte tokens that UTF-8 text never holds
awk 'BEGIN { a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/" } { print }
     END { for (r = NR; r < 128000; r++) { v = 16252928 + r; # 0xF80000 + r
           printf "%s%s%s%s %d\n", substr(a, int(v / 262144) % 64 + 1, 1), substr(a, int(v / 4096) % 64 + 1, 1),
                  substr(a, int(v / 64) % 64 + 1, 1), substr(a, v % 64 + 1, 1), r } }' $D/llama3_ranks.tiktoken > "$work/llama3.tiktoken"

# 1. JSON lines: exact bytes, and the structure checked from the tokens themselves
tok -o "$work/docs" -s "$S" --jsonl text $D/docs.jsonl
check "JSON lines: shards identical to the independent implementation's" same_shards $E/docs "$work/docs"
check "JSON lines: no state or temporary file left" test -z "$(compgen -G "$work/*state*"; compgen -G "$work/*tmp*")"
mapfile -t shards < <(shard_list "$work/docs")
ok=1; n_shards=${#shards[@]}
for i in "${!shards[@]}"; do
    f=${shards[$i]}
    n=$(( ($(stat -c %s "$f") - 1024) / 2 ))
    [ "$(header "$f")" = "20240520 1 $n" ] || ok=0
    [ "$i" -eq $((n_shards - 1)) ] || [ "$n" -eq "$S" ] || ok=0   # all full but the last
done
check "JSON lines: headers (magic, version, count = file size), every shard but the last full" test $ok -eq 1
check "JSON lines: first shard is val, the rest train" \
    test "$(compgen -G "$work/docs_val_*" | wc -l)-$(compgen -G "$work/docs_train_*" | wc -l)" = "1-$((n_shards - 1))"
stream=$(for f in "${shards[@]}"; do tokens "$f" 2; done)
check "JSON lines: the stream starts with <|endoftext|>" test "$(echo "$stream" | head -n 1)" = 50256
check "JSON lines: one <|endoftext|> per document ($DOCS)" test "$(echo "$stream" | grep -cx 50256)" -eq "$DOCS"
check "JSON lines: a document that fills the val shard exactly leaves the next to start the train shard" \
    test "$(tokens "$work/docs_train_000001.bin" 2 | head -n 1)" = 50256
check "JSON lines: a document that does not fit goes on in the next shard" \
    test "$(tokens "$work/docs_train_000002.bin" 2 | head -n 1)" != 50256

# 2. plain text, records, standard input: the same bytes
tok -o "$work/text" -s "$ST" $D/text/a.txt $D/text/b.txt $D/text/c.txt
check "plain text: shards identical to the independent implementation's" same_shards $E/text "$work/text"
check "plain text: one <|endoftext|> per file" test "$(for f in "$work"/text_*.bin; do tokens "$f" 2; done | grep -cx 50256)" -eq 3
tok -o "$work/rec" -s "$S" --records $D/docs.rec
check "records: same shards as JSON lines" same_shards $E/docs "$work/rec"
tok -o "$work/stdin" -s "$S" --jsonl text - < $D/docs.jsonl
check "JSON lines from standard input (a file)" same_shards $E/docs "$work/stdin"
cat $D/docs.rec | tok -o "$work/pipe" -s "$S" --records -
check "records from a pipe" same_shards $E/docs "$work/pipe"

# 3. --val-docs: the val shard is exactly the first K documents; the token stream is the same
tok -o "$work/vd" -s "$S" --val-docs "$K" --jsonl text $D/docs.jsonl
check "--val-docs $K: shards identical to the independent implementation's" same_shards $E/valdocs "$work/vd"
check "--val-docs $K: the val shard holds $K documents" test "$(tokens "$work/vd_val_000000.bin" 2 | grep -cx 50256)" -eq "$K"
check "--val-docs $K: the train shards start with the next document" test "$(tokens "$work/vd_train_000001.bin" 2 | head -n 1)" = 50256
check "--val-docs $K: the same tokens in all" cmp -s <(for f in $(shard_list "$work/vd"); do tokens "$f" 2; done) <(echo "$stream")

# 4. threads and batches do not change a byte
for t in 1 2 3; do
    for b in 1 4; do
        OMP_NUM_THREADS=$t tok -o "$work/t${t}b$b" -s "$S" --batch-docs $b --jsonl text $D/docs.jsonl
        check "OMP_NUM_THREADS=$t --batch-docs $b: same shards" same_shards $E/docs "$work/t${t}b$b"
    done
done

# 5. resume after --max-shards: the state names the complete shards, --resume writes the rest
tok -o "$work/r" -s "$S" --max-shards 2 --jsonl text $D/docs.jsonl
check "--max-shards 2 stops with 2 shards and a state file" test "$(ls "$work"/r_*.bin | wc -l)-$(ls "$work"/r.state | wc -l)" = "2-1"
expect_error "r.state exists: an interrupted run" ./tokenize -o "$work/r" -s "$S" --jsonl text $D/docs.jsonl
expect_error "is for -s $S, this run has -s 1000" ./tokenize -o "$work/r" -s 1000 --resume --jsonl text $D/docs.jsonl
expect_error "is for --vocab gpt2" ./tokenize -o "$work/r" -s "$S" --resume --vocab llama3 -t "$work/llama3.tiktoken" --jsonl text $D/docs.jsonl
tac $D/docs.jsonl > "$work/reversed.jsonl"
expect_error "does not continue the last complete shard" ./tokenize -o "$work/r" -s "$S" --resume --jsonl text "$work/reversed.jsonl"
head -n 3 $D/docs.jsonl > "$work/short.jsonl"
expect_error "the input ends before" ./tokenize -o "$work/r" -s "$S" --resume --jsonl text "$work/short.jsonl"
tok -o "$work/r" -s "$S" --resume --max-shards 4 --jsonl text $D/docs.jsonl
check "--resume --max-shards 4 adds 2 shards" test "$(ls "$work"/r_*.bin | wc -l)" -eq 4
tok -o "$work/r" -s "$S" --resume --jsonl text $D/docs.jsonl
check "resumed twice: shards identical to an uninterrupted run's" same_shards $E/docs "$work/r"
check "resumed: the state file is gone at the end" test ! -e "$work/r.state"
tok -o "$work/rt" -s "$ST" --max-shards 1 $D/text/a.txt $D/text/b.txt $D/text/c.txt
tok -o "$work/rt" -s "$ST" --resume $D/text/a.txt $D/text/b.txt $D/text/c.txt
check "plain text resumed: identical shards" same_shards $E/text "$work/rt"
tok -o "$work/rv" -s "$S" --val-docs "$K" --max-shards 1 --jsonl text $D/docs.jsonl
tok -o "$work/rv" -s "$S" --val_docs "$K" --resume --jsonl text $D/docs.jsonl
check "--val-docs resumed (with its older spelling --val_docs): identical shards" same_shards $E/valdocs "$work/rv"

# 6. resume after kill -9: a reader feeds two copies of the documents and stalls; tokenize is killed
# once 3 shards are complete, and --resume on the whole input gives the uninterrupted run's bytes
for i in 1 2 3 4; do cat $D/docs.jsonl; done > "$work/four.jsonl"
tok -o "$work/full" -s "$S" --jsonl text "$work/four.jsonl"
mkfifo "$work/fifo"
./tokenize -o "$work/k" -s "$S" --batch-docs 2 --jsonl text - < "$work/fifo" > /dev/null 2>&1 &
pid=$!
exec 3> "$work/fifo"
head -n $(( $(wc -l < $D/docs.jsonl) * 2 )) "$work/four.jsonl" >&3
for _ in $(seq 100); do
    [ "$(awk '$1 == "shards" {print $2}' "$work/k.state" 2>/dev/null)" -ge 3 ] 2>/dev/null && break
    sleep 0.1
done
kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null; status=$?
exec 3>&-
check "kill -9 stopped tokenize mid-run (status $status)" test "$status" -eq 137
check "the killed run left complete shards and a state" test -s "$work/k.state"
tok -o "$work/k" -s "$S" --resume --jsonl text "$work/four.jsonl"
check "resumed after kill -9: shards identical to an uninterrupted run's" same_shards "$work/full" "$work/k"

# 7. bad input: one line naming the file and what is wrong, before any shard is written
printf '{"text": "fine"}\n{"text": "no end}\n' > "$work/bad.jsonl"
expect_error "bad.jsonl:2: unterminated string (--jsonl text)" ./tokenize -o "$work/e" --jsonl text "$work/bad.jsonl"
printf '{"text": "fine"}\n\n{"body": "x"}\n' > "$work/field.jsonl"
expect_error "field.jsonl:3: no string field of that name" ./tokenize -o "$work/e" --jsonl text "$work/field.jsonl"
printf '{"text": "fine"}\n{"text": "bad \xc3\x28"}\n' > "$work/utf8.jsonl"
expect_error "utf8.jsonl: line 2 is not valid UTF-8 at byte 31 of the file" ./tokenize -o "$work/e" --jsonl text "$work/utf8.jsonl"
printf 'bad \xc3\x28' > "$work/bad_doc.txt"
expect_error "bad_doc.txt is not valid UTF-8 at byte 4" ./tokenize -o "$work/e" "$work/bad_doc.txt"
expect_error "--invalid-utf8 is stop, replace or skip, got 'drop'" ./tokenize -o "$work/e" --invalid-utf8 drop "$work/bad_doc.txt"

# 8. --invalid-utf8: replace as Python's bytes.decode(errors="replace") does (one U+FFFD per maximal
# ill-formed subsequence: a cut sequence is one, a bad lead or stray continuation byte one each), or
# skip the document; counted in the summary
bad='{"text": "cut \xe2\x82 lead \xc3\x28 four \xf0\x9f\x98 over \xf0\x80\x80x sur \xed\xa0\x80 ff \xff end"}'
fixed='{"text": "cut \xef\xbf\xbd lead \xef\xbf\xbd( four \xef\xbf\xbd over \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbdx sur \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd ff \xef\xbf\xbd end"}'
printf '{"text": "one"}\n%b\n{"text": "three"}\n' "$bad" > "$work/u_bad.jsonl"
printf '{"text": "one"}\n%b\n{"text": "three"}\n' "$fixed" > "$work/u_fixed.jsonl"
printf '{"text": "one"}\n{"text": "three"}\n' > "$work/u_skipped.jsonl"
./tokenize -o "$work/u_rep" --jsonl text --invalid-utf8 replace "$work/u_bad.jsonl" > "$work/u_rep.txt" 2>&1
tok -o "$work/u_fix" --jsonl text "$work/u_fixed.jsonl"
check "--invalid-utf8 replace: the shards of the text with U+FFFD put in" same_shards "$work/u_fix" "$work/u_rep"
check "--invalid-utf8 replace: counted" grep -q "invalid UTF-8: 10 ill-formed sequences replaced with U+FFFD in 1 document$" "$work/u_rep.txt"
./tokenize -o "$work/u_skip" --jsonl text --invalid-utf8 skip "$work/u_bad.jsonl" > "$work/u_skip.txt" 2>&1
tok -o "$work/u_ref" --jsonl text "$work/u_skipped.jsonl"
check "--invalid-utf8 skip: the shards without the document" same_shards "$work/u_ref" "$work/u_skip"
check "--invalid-utf8 skip: counted, and as one of the 3 input documents" \
    bash -c 'grep -q "invalid UTF-8: 1 document skipped$" "$0" && grep -q "^tokenize: 3 documents," "$0"' "$work/u_skip.txt"
printf 'whole \xc3 file' > "$work/u_file.txt"
printf 'whole \xef\xbf\xbd file' > "$work/u_file_fixed.txt"
tok -o "$work/u_frep" --invalid-utf8 replace "$work/u_file.txt"
tok -o "$work/u_ffix" "$work/u_file_fixed.txt"
check "--invalid-utf8 replace: a whole-file document" same_shards "$work/u_ffix" "$work/u_frep"
head -c 100 $D/docs.rec > "$work/cut.rec"
expect_error "cut.rec ends inside record 4 (at byte 93)" ./tokenize -o "$work/e" --records "$work/cut.rec"
expect_error "cannot read $work/missing.txt" ./tokenize -o "$work/e" "$work/missing.txt"
: > "$work/empty.jsonl"
expect_error "no documents in the input" ./tokenize -o "$work/e" --jsonl text "$work/empty.jsonl"
expect_error "--val-docs 99, but there are only $DOCS documents" ./tokenize -o "$work/e" --val-docs 99 --jsonl text $D/docs.jsonl
expect_error "the input ended after $DOCS documents, --total-docs says 99" ./tokenize -o "$work/e" --total-docs 99 --jsonl text $D/docs.jsonl
expect_error "--records and --jsonl" ./tokenize -o "$work/e" --records --jsonl text $D/docs.jsonl
expect_error "--vocab llama3 needs -t" ./tokenize -o "$work/e" --vocab llama3 $D/docs.jsonl
expect_error "has 50256 ranks; Llama-3's tokenizer.model has 128000" ./tokenize -o "$work/e" --vocab llama3 -t data/r50k_base.tiktoken $D/docs.jsonl
expect_error "-s needs an integer, got '1.5'" ./tokenize -o "$work/e" -s 1.5 $D/docs.jsonl
expect_error "--val_docs is the older spelling of --val-docs: give one" ./tokenize -o "$work/e" --val-docs 2 --val_docs 2 $D/docs.jsonl
expect_error "-o OUT is required" ./tokenize $D/docs.jsonl
expect_error "no input: give the FILEs after the flags" ./tokenize -o "$work/e"
expect_error "all 2 documents were left out for invalid UTF-8 (--invalid-utf8 skip): nothing to write" \
    ./tokenize -o "$work/e" --invalid-utf8 skip "$work/bad_doc.txt" "$work/u_file.txt"
check "errors wrote no shards" test -z "$(compgen -G "$work/e_*")"
check "a short run on a pipe prints no progress lines" test -z "$(./tokenize -o "$work/q" -s "$S" --jsonl text $D/docs.jsonl 2>&1 >/dev/null)"
# a split left empty: a warning, and the shards are still written
./tokenize -o "$work/small" --jsonl text $D/docs.jsonl > /dev/null 2> "$work/small.txt"
check "all in the val shard: a warning that there is no train shard" \
    bash -c '[ "$(wc -l < "$0")" -eq 1 ] && grep -q "^warning: no train shard: all [0-9]* tokens fit in the val shard of -s 100000000 tokens" "$0"' "$work/small.txt"
./tokenize -o "$work/allval" --val-docs "$DOCS" --jsonl text $D/docs.jsonl > /dev/null 2> "$work/allval.txt"
check "--val-docs taking every document: a warning" grep -q "^warning: no train shard: --val-docs $DOCS took every document$" "$work/allval.txt"
# --help: the flags, as the other binaries list them, and exit 0
./tokenize --help > "$work/help.txt"
check "--help exits 0" test $? -eq 0
check "--help lists the flags as the other binaries do" \
    bash -c 'grep -q "^usage: ./tokenize -o OUT \[flags\] FILE...$" "$0" && grep -q "^flags (default in brackets):$" "$0" &&
             grep -q "^      --val-docs  .*\[0\]$" "$0" && ! grep -q "val_docs" "$0"' "$work/help.txt"

# 8. Llama-3: its pre-tokenizer on a rank file of the cl100k_base tokens these documents need (same
# pattern), padded to Llama-3's 128000 ranks (above)
tok -o "$work/l3" --vocab llama3 -t "$work/llama3.tiktoken" --jsonl text $D/llama3.jsonl
check "llama3: shard identical to the independent implementation's" same_shards $E/llama3 "$work/l3"
n=$(( ($(stat -c %s "$work/l3_val_000000.bin") - 1024) / 4 ))
check "llama3: uint32 header (magic 20240801, version 7)" test "$(header "$work/l3_val_000000.bin")" = "20240801 7 $n"
check "llama3: <|begin_of_text|> (128000) before each document" \
    test "$(tokens "$work/l3_val_000000.bin" 4 | grep -cx 128000)-$(tokens "$work/l3_val_000000.bin" 4 | head -n 1)" = "$(grep -c . $D/llama3.jsonl)-128000"

# 9. fineweb.sh: argument checks (before any download); with node and its packages, parquet files to
# shards, resuming, and the download from a local stand-in for the hub
fw() { bash dev/data/fineweb.sh "$@"; }
check "fineweb.sh --help" bash -c 'bash dev/data/fineweb.sh --help | grep -q "bash dev/data/fineweb.sh --install"'
expect_error "-t is classic or edu, got 'news'" fw -t news
expect_error "-v is 10B, 100B or 350B, got '7B'" fw -v 7B
expect_error "-m is gpt2 or llama3, got 'bert'" fw -m bert
expect_error "-m llama3 needs --tokenizer FILE" fw -m llama3
expect_error "-j wants a positive whole number, got '0'" fw -j 0
expect_error "unknown argument '--bogus'" fw --bogus
expect_error "--local $work/nowhere is not a directory" fw --local "$work/nowhere"
if [ -d build/npm-fineweb/node_modules/hyparquet ] && [ -d build/npm-fineweb/node_modules/hyparquet-compressors ] &&
   command -v node > /dev/null && command -v curl > /dev/null; then
    fw --local $D/parquet -o "$work/fw" -s "$S" -j 2 > "$work/fw.txt" 2>&1
    check "fineweb.sh --local: parquet to shards identical to the JSON lines'" same_shards $E/docs "$work/fw/fineweb"
    fw --local $D/parquet -o "$work/fw" -s "$S" > "$work/fw2.txt" 2>&1
    check "fineweb.sh: a rerun sees the shards are complete" grep -q "already complete" "$work/fw2.txt"
    # an interrupted run: the parquet reader skips the documents that complete shards hold
    mkdir -p "$work/fwr"
    tok -o "$work/fwr/fineweb" -s "$S" --max-shards 3 --jsonl text $D/docs.jsonl
    fw --local $D/parquet -o "$work/fwr" -s "$S" -j 3 > "$work/fwr.txt" 2>&1
    check "fineweb.sh resumes an interrupted tokenization: identical shards" same_shards $E/docs "$work/fwr/fineweb"
    check "fineweb.sh resumed at the state's document" grep -q "resuming after 3 complete shards" "$work/fwr.txt"
    # the download, from a stand-in for the hub: the file list in two pages, resolve URLs that redirect,
    # transfers that break off halfway the first time (curl -C - must go on), SHA-256 checked
    cat > "$work/hub.js" <<'EOF'
// page 1: the second file and a directory, page 2: the first; a transfer breaks off halfway the first time
const http = require('http'), fs = require('fs'), crypto = require('crypto'), path = require('path');
const [dir, portFile] = process.argv.slice(2);
const files = fs.readdirSync(dir).filter(f => f.endsWith('.parquet')).sort();
const broken = new Set();
const tree = '/api/datasets/HuggingFaceFW/fineweb/tree/main/sample/10BT';
const server = http.createServer((req, res) => {
  const url = new URL(req.url, 'http://hub');
  if (url.pathname === tree) {
    const first = url.searchParams.get('cursor') !== '2';
    const entries = [first ? files[1] : files[0]].map(f => {
      const data = fs.readFileSync(path.join(dir, f));
      return { type: 'file', path: `sample/10BT/${f}`, size: data.length,
               lfs: { oid: crypto.createHash('sha256').update(data).digest('hex'), size: data.length } };
    });
    const headers = { 'content-type': 'application/json' };
    if (first) {
      entries.push({ type: 'directory', path: 'sample/10BT/more' });
      headers.link = `<http://127.0.0.1:${server.address().port}${tree}?cursor=2>; rel="next"`;
    }
    res.writeHead(200, headers);
    res.end(JSON.stringify(entries));
    return;
  }
  const resolve = url.pathname.match(/^\/datasets\/HuggingFaceFW\/fineweb\/resolve\/main\/sample\/10BT\/(.*)$/);
  if (resolve) { res.writeHead(302, { location: `/cdn/${resolve[1]}` }); res.end(); return; }
  const cdn = url.pathname.match(/^\/cdn\/(.*)$/);
  if (!cdn || !files.includes(cdn[1])) { res.writeHead(404); res.end(); return; }
  const data = fs.readFileSync(path.join(dir, cdn[1]));
  const range = (req.headers.range || '').match(/bytes=(\d+)-/);
  const start = range ? Number(range[1]) : 0;
  res.writeHead(range ? 206 : 200, { 'content-length': data.length - start,
    ...(range ? { 'content-range': `bytes ${start}-${data.length - 1}/${data.length}` } : {}) });
  if (broken.has(cdn[1])) { res.end(data.subarray(start)); return; }
  broken.add(cdn[1]);
  res.write(data.subarray(start, start + (data.length >> 1)));
  setTimeout(() => res.socket.destroy(), 50);
});
server.listen(0, '127.0.0.1', () => fs.writeFileSync(portFile, String(server.address().port)));
EOF
    node "$work/hub.js" $D/parquet "$work/port" & hub=$!
    for _ in $(seq 50); do [ -s "$work/port" ] && break; sleep 0.1; done
    HF_ENDPOINT=http://127.0.0.1:$(cat "$work/port")
    export HF_ENDPOINT
    fw -o "$work/net" -s "$S" > "$work/net.txt" 2>&1
    check "fineweb.sh download: listing in pages, interrupted transfers resumed, shards identical" same_shards $E/docs "$work/net/fineweb"
    check "fineweb.sh download: parquet files kept, in name order" \
        test "$(awk '{print $1}' "$work/net/parquet/files.txt" | tr '\n' ' ')" = "sample/10BT/000_00000.parquet sample/10BT/001_00000.parquet "
    check "fineweb.sh download: the files are the hub's" cmp -s $D/parquet/001_00000.parquet "$work/net/parquet/001_00000.parquet"
    kill $hub
    hub=""
    unset HF_ENDPOINT
else
    echo "SKIP tokenize: fineweb.sh on parquet files (its reader is not installed: bash dev/data/fineweb.sh --install)"
fi

finish
