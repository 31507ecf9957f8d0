// Writes test/data/tokenizer_vectors.txt: strings and their GPT-2 (r50k_base) ids from the npm package
// gpt-tokenizer, the reference that test/test_tokenizer.cpp checks llmc/tokenizer.h against. Besides
// hand-picked strings it takes a few KB of each source of the embedded corpus from the documents file
// that dev/data/build_corpus.sh leaves in build/corpus/docs.jsonl.
//   node dev/data/gen_tokenizer_vectors.js [DOCS_JSONL]
// Format, one vector per pair of lines ('#' lines are comments, for people only):
//   text <UTF-8 bytes in hex>
//   ids <id> <id> ...
// Avoids U+0085 and U+FEFF, where JavaScript's \s differs from Unicode White_Space, and characters
// newer than the Unicode version of llmc/unicode_tables.h.
'use strict';
const fs = require('fs');
const path = require('path');
const { execSync } = require('child_process');

const GPT_TOKENIZER = 'gpt-tokenizer@4.0.0';
const root = path.resolve(__dirname, '..', '..');
const npmDir = path.join(root, 'build', 'npm');
const pkgDir = path.join(npmDir, 'node_modules', 'gpt-tokenizer');
const wanted = GPT_TOKENIZER.split('@')[1];
const installed = () => fs.existsSync(path.join(pkgDir, 'package.json')) &&
  JSON.parse(fs.readFileSync(path.join(pkgDir, 'package.json'), 'utf8')).version === wanted;
if (!installed()) {
  execSync(`npm install --silent --no-save --prefix "${npmDir}" ${GPT_TOKENIZER}`, { stdio: 'inherit' });
}
const { encode } = require(path.join(pkgDir, 'cjs', 'encoding', 'r50k_base.js'));
// ordinary text: "<|endoftext|>" in it is text, not the special token
const encodeOrdinary = (s) => encode(s, { disallowedSpecial: new Set() });

const strings = [
  '',
  'Hello world',
  'The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst of times; ' +
    'it was the age of wisdom, it was the age of foolishness.',
  "don't I'll we've they're she's he'd you'll I'm it's",
  "DON'T I'LL WE'VE They'Re o'clock rock'n'roll 'tis ''s '''re 'll'",
  "He said 'hello' and 'sd'tx",
  'In 1984, 3.14159 and 1,000,000 people paid $12.50 for 42nd-floor views; 0x1F, 2024-05-20, 007.',
  ' 123 456 7890  12345678901234567890',
  'Wait... what?!?! (yes) [no] {maybe} <tag/> ---- **bold** ==== "quoted" `code` ~~~ @#$%^&*',
  'a  b   c    d     e',
  'line one\nline two\n\nparagraph\n\n\n   indented\n\tTabbed\t\tdouble',
  'trailing spaces   ',
  'trailing newline\n',
  'trailing mix \t\n ',
  '   leading spaces',
  ' ',
  '  ',
  '\n',
  '\n\n \t ',
  'a \nb a \n b x  \t\ny z\t \tw',
  'windows\r\nline\r\n\r\nends\r\n',
  'Café naïve façade résumé São Paulo Zürich Ångström señor crème brûlée',
  'e\u0301 combining acute, ﬁ ligature, Å vs A\u030a',
  '日本語のテキストです。中文文本，很好。한국어 텍스트',
  'I ❤️ 🍕 and 👨‍👩‍👧‍👦 family 🇫🇷 flags 😀😃 👍🏽',
  'مرحبا بالعالم، كيف حالك؟',
  'नमस्ते दुनिया, आप कैसे हैं?',
  'Привет мир! Γειά σου Κόσμε. שלום עולם',
  'Le café coûte 3,50 € — 日本 🎉 don\'t stop! Ça va? ١٢٣ ok',
  '٣٤٥ ½ ⅓ Ⅻ x² ①②',
  'a\u00a0b\u2003c\u3000d\u2028e\u2029f \u00a0 g',
  '<|endoftext|> is ordinary text here',
  'supercalifragilisticexpialidocious antidisestablishmentarianism',
  'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa',
  '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!????????????........',
  '                                x',
  'ctrl \u0000 nul \u0001\u007f bell\u0007 esc\u001b[0m',
  'def f(x):\n    return x**2  # square\n\nif __name__ == "__main__":\n\tprint(f(3))\n',
  'https://example.com/path?q=1&x=y#frag user@example.org',
  '𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛 𐍈 \u{E000} \u0378',
];

// random strings over characters of every class the pattern tells apart (letters of several scripts,
// marks, digits and other numbers, symbols, emoji, kinds of whitespace), weighted towards the ASCII
// cases that the contractions and the optional space are about
const alphabet = [..."abcxyzABCXYZ0123456789 .,;!?'\"-()#*"].concat(["'s", "'t", "'re", "'ve", "'m", "'ll", "'d",
  ' ', '  ', '\n', '\n\n', '\t', '\r\n', '\u000b', '\u000c', '\u00a0', '\u2003', '\u3000', '\u2028', '\u1680',
  'é', 'ß', 'ñ', 'Ж', 'ω', 'א', 'ب', 'ह', '\u093f', '\u094d', '\u0301', '\u200d', '日', '本', 'ア', '한', 'ー',
  '½', '²', '٣', 'Ⅻ', '①', '€', '’', '—', '…', '🎉', '👍', '\u{1F3FD}', '𝔘', '𝟙', '\u0000', '\u007f']);
let seed = 20240520;
const random = (n) => { // a 31-bit linear congruential generator: fixed, so the vectors are too
  seed = (seed * 1103515245 + 12345) % 2147483648;
  return Math.floor((seed / 2147483648) * n);
};
for (let i = 0; i < 150; i++) {
  let s = '';
  for (let k = random(40); k > 0; k--) s += alphabet[random(alphabet.length)];
  strings.push(s);
}

// a few KB of each corpus source, cut at line ends
const docsPath = process.argv[2] || path.join(root, 'build', 'corpus', 'docs.jsonl');
if (!fs.existsSync(docsPath)) {
  console.error(`error: cannot read ${docsPath} (run dev/data/build_corpus.sh first)`);
  process.exit(1);
}
const seen = new Set();
for (const line of fs.readFileSync(docsPath, 'utf8').split('\n')) {
  if (line.length === 0) continue;
  const doc = JSON.parse(line);
  if (seen.has(doc.source)) continue;
  seen.add(doc.source);
  const cut = doc.text.lastIndexOf('\n', 3000);
  strings.push(doc.text.slice(0, cut > 0 ? cut + 1 : 3000));
}

const out = ['# GPT-2 r50k_base reference ids from npm ' + GPT_TOKENIZER + ', written by dev/data/gen_tokenizer_vectors.js',
  '# per vector: "text <UTF-8 hex>" then "ids <ids>"'];
for (const s of strings) {
  const shown = JSON.stringify(s);
  out.push('# ' + (shown.length > 100 ? shown.slice(0, 97) + '..."' : shown));
  out.push('text ' + Buffer.from(s, 'utf8').toString('hex'));
  out.push('ids ' + encodeOrdinary(s).join(' '));
}
const outPath = path.join(root, 'test', 'data', 'tokenizer_vectors.txt');
fs.mkdirSync(path.dirname(outPath), { recursive: true });
fs.writeFileSync(outPath, out.join('\n') + '\n');
console.log(`wrote ${path.relative(root, outPath)}: ${strings.length} vectors`);
