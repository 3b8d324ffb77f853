#!/usr/bin/env python3
"""Builds the text corpus for examples/traces/train_and_extract.py from what Debian packages ship on
this machine (no downloads): licences, copyright files, changelogs, README/NEWS files, English man
pages (roff stripped crudely), Perl POD/modules and the Python standard library's sources.

Every document is normalised to UTF-8 (invalid UTF-8 is read as Latin-1), control characters other
than tab and newline are dropped, and it is deduplicated: whole documents by hash, and paragraphs
of 300 bytes or more that were already seen anywhere (the GPL text inside many copyright files).
Documents are grouped by the Debian SOURCE package that ships them (dpkg's file lists and status
file); a source package is either in the held-out split or in the training split, never both.

Writes into OUTDIR (default .corpus/ at the repo root, ignored by git):
  train.bin.gz      the training documents, UTF-8, separated by one NUL byte;
  heldout.jsonl.gz  long held-out contexts (16-64 KiB), one JSON object a line: id, package, kinds,
                    bytes, files (provenance), text;
  manifest.json     counts and bytes per kind and split, the folders read, the caps, the packages
                    of the held-out split, sha256 of the two data files.

python3 stdlib only. Deterministic: the same machine gives byte-identical files.
  python3 examples/traces/build_corpus.py [--out DIR] [--train-cap-mb 40] [--heldout-mb 4]
"""

from __future__ import annotations

import argparse
import glob
import gzip
import hashlib
import json
import os
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Per-kind caps on the training split (MB of normalised text); the total is capped by --train-cap-mb.
KIND_CAPS_MB = {"license": 1, "copyright": 8, "changelog": 10, "doc": 8, "man": 12, "perl": 6, "python": 6}
KIND_ORDER = ["license", "copyright", "changelog", "doc", "man", "perl", "python"]
MIN_DOC = 200            # bytes: shorter documents are dropped
PARA_DEDUP = 300         # bytes: paragraphs this long or longer are kept only once
MAX_FILE = 4 << 20       # bytes: larger source files are skipped (generated data, not text)
CTX_MIN, CTX_TARGET, CTX_MAX = 16 << 10, 40 << 10, 64 << 10

DOC_NAME = re.compile(r"^(changelog|news|readme|todo|authors|thanks|faq|history|changes|bugs|copying|"
                      r"credits|hacking|install|notes|usage)([._-].*)?$", re.I)
DOC_EXT = re.compile(r"\.(txt|md|rst|text)(\.gz)?$", re.I)


def dpkg_maps():
    """path -> binary package (dpkg's *.list), binary -> source package (dpkg's status file)."""
    owner = {}
    for lst in sorted(glob.glob("/var/lib/dpkg/info/*.list")):
        pkg = os.path.basename(lst)[:-5].split(":")[0]
        try:
            with open(lst, encoding="utf-8", errors="replace") as f:
                for line in f:
                    owner.setdefault(line.rstrip("\n"), pkg)
        except OSError:
            pass
    source = {}
    try:
        with open("/var/lib/dpkg/status", encoding="utf-8", errors="replace") as f:
            pkg = None
            for line in f:
                if line.startswith("Package:"):
                    pkg = line.split()[1]
                    source.setdefault(pkg, pkg)
                elif line.startswith("Source:") and pkg:
                    source[pkg] = line.split()[1]
    except OSError:
        pass
    return owner, source


def read_bytes(path):
    try:
        if os.path.getsize(path) > MAX_FILE:
            return None
        with open(path, "rb") as f:
            data = f.read()
        if path.endswith(".gz"):
            data = gzip.decompress(data)
        return data if len(data) <= 4 * MAX_FILE else None
    except (OSError, EOFError, gzip.BadGzipFile, ValueError):
        return None


CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def normalise(data: bytes) -> str | None:
    if b"\x00" in data[:8192]:
        return None  # binary
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\f", "\n")
    text = CTRL.sub("", text)
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    text = re.sub(r"\n{3,}", "\n\n", text).strip("\n")
    return text + "\n" if text else None


# ---- roff, crudely ----
ROFF_DROP = set("""de ds nr so ft fam in ti ad na nh hy ne ta ll tr fi nf ig if ie el rm rr am as als
cu ul ps vs ls ev mso pc lf cc c2 ec eo rn it wh ch dt em tm ab ex pl po bp pn sv os ns rs de1 do
hw hc hla hlm hpf ss cs bd fp fspecial ftr char cflags tkf kern lg mk rt sp br PD UC DT IX TH Dd Dt Os
Bl El Bd Ed Xc Xo Pp PP LP P TP IP HP RS RE EX EE YS SY OP UR UE MT ME""".split())
ROFF_INLINE = [
    (re.compile(r"\\f(\[[^\]]*\]|\(..|.)"), ""),
    (re.compile(r"\\s[+-]?\d+"), ""),
    (re.compile(r"\\\*(\[[^\]]*\]|\(..|.)"), ""),
    (re.compile(r"\\\((aq|cq|oq)"), "'"),
    (re.compile(r"\\\((lq|rq|dq)"), '"'),
    (re.compile(r"\\\((em|en|hy|mi)"), "-"),
    (re.compile(r"\\\((bu|ci)"), "*"),
    (re.compile(r"\\\(co"), "(c)"),
    (re.compile(r"\\\(..|\\\[[^\]]*\]"), ""),
    (re.compile(r"\\[-]"), "-"),
    (re.compile(r"\\e"), "\\\\"),
    (re.compile(r"\\[&|^%c:!)0 ]"), ""),
    (re.compile(r"\\[nkgwzhvoNbDlLxXZYV]('[^']*'|\[[^\]]*\]|\(..|.)?"), ""),
    (re.compile(r"\\\\"), "\\\\"),
]


def strip_roff(text: str) -> str:
    out, skip_until_dots = [], False
    for line in text.split("\n"):
        if skip_until_dots:  # the body of a macro definition (.de/.am/.ig) runs to a ".." line
            skip_until_dots = not line.startswith("..")
            continue
        if line.startswith((".de", ".am", ".ig", "'de")) and (len(line) == 3 or line[3] in " \t1"):
            skip_until_dots = True
            continue
        if line.startswith((".\\\"", "'\\\"", '.\\#', "\\\"")) or line in (".", "'"):
            continue
        if line.startswith((".", "'")):
            parts = line[1:].strip().split(None, 1)
            if not parts:
                continue
            macro, args = parts[0], parts[1] if len(parts) > 1 else ""
            if macro in ("SH", "SS", "Sh", "Ss"):
                out.append("")
                args = args.replace('"', "")
                out.append(args.upper() if macro in ("SH", "Sh") else args)
                continue
            if macro in ROFF_DROP or macro.startswith(("\\", "if", "ie", "el")):
                if macro in ("PP", "LP", "P", "Pp", "sp", "TP", "IP", "HP"):
                    out.append("")
                continue
            if macro in ("B", "I", "BR", "RB", "IR", "RI", "BI", "IB", "SM", "SB"):
                words = re.findall(r'"[^"]*"|\S+', args)
                args = ("" if macro in ("B", "I", "SM", "SB") else "").join(w.strip('"') for w in words) \
                    if len(macro) == 2 else " ".join(w.strip('"') for w in words)
            else:  # mdoc and the rest: keep the arguments as words
                args = " ".join(w.strip('"') for w in re.findall(r'"[^"]*"|\S+', args)
                                if not re.fullmatch(r"(Fl|Ar|Op|Oo|Oc|Pa|Nm|Nd|Cm|Xr|Ql|Dq|Sq|Pq|Ns|"
                                                    r"Ic|Ev|Va|Em|Sy|Li|Fa|Fn|Ft|Fo|Fc|It|Ta|No)", w))
            line = args
        for rx, rep in ROFF_INLINE:
            line = rx.sub(rep, line)
        out.append(line)
    return "\n".join(out)


def candidates():
    """(kind, path) pairs, sorted within kinds; symlinked duplicates collapse by real path."""
    c = []
    for p in sorted(glob.glob("/usr/share/common-licenses/*")):
        c.append(("license", p))
    for d in sorted(glob.glob("/usr/share/doc/*")):
        for dirpath, dirnames, filenames in os.walk(d):
            dirnames.sort()
            for fn in sorted(filenames):
                p = os.path.join(dirpath, fn)
                if fn == "copyright":
                    c.append(("copyright", p))
                elif fn.lower().startswith(("changelog", "news")):
                    c.append(("changelog", p))
                elif DOC_NAME.match(fn) or DOC_EXT.search(fn):
                    c.append(("doc", p))
    for p in sorted(glob.glob("/usr/share/man/man*/*")):
        c.append(("man", p))
    for base in sorted(set(glob.glob("/usr/share/perl/*") + glob.glob("/usr/share/perl5")
                           + glob.glob("/usr/lib/x86_64-linux-gnu/perl*/*") + glob.glob("/usr/lib/*/perl5/*"))):
        if os.path.islink(base):
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for fn in sorted(filenames):
                if fn.endswith((".pod", ".pm")):
                    c.append(("perl", os.path.join(dirpath, fn)))
    for base in sorted(glob.glob("/usr/lib/python3.*")) + ["/usr/lib/python3/dist-packages"]:
        if os.path.islink(base) or not os.path.isdir(base):
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(x for x in dirnames if x not in ("__pycache__", "test", "tests", "idlelib"))
            for fn in sorted(filenames):
                if fn.endswith(".py"):
                    c.append(("python", os.path.join(dirpath, fn)))
    seen, out = set(), []
    for kind, p in c:
        if not os.path.isfile(p):
            continue
        rp = os.path.realpath(p)
        if rp in seen:
            continue
        seen.add(rp)
        out.append((kind, p, rp))
    return out


def h(s: str) -> str:
    return hashlib.sha1(s.encode()).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, ".corpus"))
    ap.add_argument("--train-cap-mb", type=float, default=40.0, help="cap on the training split (MB)")
    ap.add_argument("--heldout-mb", type=float, default=4.0, help="target size of the held-out split (MB)")
    ap.add_argument("--heldout-per-package-kb", type=int, default=192,
                    help="at most this much held-out text from one source package (its rest is dropped)")
    args = ap.parse_args()
    t0 = time.time()
    owner, source = dpkg_maps()

    docs = []  # dict(kind, path, package, text)
    seen_doc, seen_para = set(), set()
    stats = {"files_seen": 0, "unreadable_or_binary": 0, "too_short": 0, "duplicate_docs": 0,
             "duplicate_paragraphs_dropped": 0, "duplicate_paragraph_bytes": 0}
    for kind, p, rp in candidates():
        stats["files_seen"] += 1
        data = read_bytes(p)
        text = normalise(data) if data is not None else None
        if text is None:
            stats["unreadable_or_binary"] += 1
            continue
        if kind == "man":
            if not re.search(r"^\.(TH|Dd|SH|Sh)\b", text, re.M):
                stats["unreadable_or_binary"] += 1  # a .so redirect or not roff
                continue
            text = normalise(strip_roff(text).encode("utf-8")) or ""
        key = hashlib.sha1(text.encode("utf-8")).digest()
        if key in seen_doc:
            stats["duplicate_docs"] += 1
            continue
        seen_doc.add(key)
        paras, kept = text.split("\n\n"), []
        for para in paras:
            if len(para) >= PARA_DEDUP:
                pk = hashlib.sha1(para.encode("utf-8")).digest()
                if pk in seen_para:
                    stats["duplicate_paragraphs_dropped"] += 1
                    stats["duplicate_paragraph_bytes"] += len(para)
                    continue
                seen_para.add(pk)
            kept.append(para)
        text = "\n\n".join(kept).strip("\n")
        if len(text.encode("utf-8")) < MIN_DOC:
            stats["too_short"] += 1
            continue
        binpkg = owner.get(p) or owner.get(rp)
        if kind == "license" and not binpkg:
            binpkg = "base-files"
        pkg = source.get(binpkg, binpkg) if binpkg else "file:" + os.path.basename(p)
        docs.append({"kind": kind, "path": p, "package": pkg, "text": text + "\n"})
    print(f"build_corpus: {len(docs)} documents after normalising and dedup ({time.time() - t0:.1f} s)", file=sys.stderr)

    by_pkg = {}
    for d in docs:
        d["bytes"] = len(d["text"].encode("utf-8"))
        by_pkg.setdefault(d["package"], []).append(d)
    pkg_bytes = {p: sum(d["bytes"] for d in ds) for p, ds in by_pkg.items()}

    # Held-out: source packages in hash order among those with at least CTX_MIN of text, until the
    # target size; licences (base-files) and the very largest packages stay in training.
    held_pkgs, held_bytes = [], 0
    for p in sorted(by_pkg, key=lambda p: h("heldout:" + p)):
        if held_bytes >= args.heldout_mb * 1e6:
            break
        if pkg_bytes[p] < CTX_MIN or p == "base-files":
            continue
        held_pkgs.append(p)
        held_bytes += min(pkg_bytes[p], args.heldout_per_package_kb << 10)
    held_set = set(held_pkgs)

    contexts = []
    for p in held_pkgs:
        budget = args.heldout_per_package_kb << 10
        cur, cur_files, cur_kinds = "", [], []
        ds = sorted(by_pkg[p], key=lambda d: (KIND_ORDER.index(d["kind"]), d["path"]))

        def flush():
            nonlocal cur, cur_files, cur_kinds, budget
            b = cur.encode("utf-8")[:CTX_MAX].decode("utf-8", "ignore")
            if len(b.encode("utf-8")) >= CTX_MIN and budget > 0:
                contexts.append({"package": p, "kinds": sorted(set(cur_kinds)), "files": cur_files,
                                 "bytes": len(b.encode("utf-8")), "text": b})
                budget -= len(b.encode("utf-8"))
            cur, cur_files, cur_kinds = "", [], []

        for d in ds:
            t = d["text"]
            while t:
                room = CTX_MAX - len(cur.encode("utf-8"))
                piece = t.encode("utf-8")[:room].decode("utf-8", "ignore")
                t = t[len(piece):]
                cur += piece
                cur_files.append(d["path"])
                cur_kinds.append(d["kind"])
                if len(cur.encode("utf-8")) >= CTX_TARGET:
                    flush()
                    if budget <= 0:
                        break
            if budget <= 0:
                break
            cur += "\n\n" if cur else ""
        flush()
    # Interleave packages and kinds: hash order of the contexts.
    contexts.sort(key=lambda c: h(c["package"] + c["files"][0] + str(c["bytes"])))
    for i, c in enumerate(contexts):
        c["id"] = i

    # Training split: every other package, kinds in KIND_ORDER with per-kind caps, within a kind by
    # package hash so that a cap drops whole packages' tails rather than a folder's alphabet end.
    cap_total = int(args.train_cap_mb * 1e6)
    per_kind = {k: [] for k in KIND_ORDER}
    for d in docs:
        if d["package"] not in held_set:
            per_kind[d["kind"]].append(d)
    train, kind_bytes, total = [], {}, 0
    dropped = {}
    for k in KIND_ORDER:
        cap = int(KIND_CAPS_MB[k] * 1e6)
        kb = 0
        for d in sorted(per_kind[k], key=lambda d: (h(d["package"]), d["path"])):
            if kb + d["bytes"] > cap or total + d["bytes"] > cap_total:
                dropped[k] = dropped.get(k, 0) + d["bytes"]
                continue
            train.append(d)
            kb += d["bytes"]
            total += d["bytes"]
        kind_bytes[k] = kb

    os.makedirs(args.out, exist_ok=True)
    train_path = os.path.join(args.out, "train.bin.gz")
    held_path = os.path.join(args.out, "heldout.jsonl.gz")
    with open(train_path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=9) as g:
        g.write(b"\x00".join(d["text"].encode("utf-8") for d in train))
    with open(held_path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=9) as g:
        for c in contexts:
            g.write((json.dumps({k: c[k] for k in ("id", "package", "kinds", "bytes", "files", "text")},
                                ensure_ascii=False) + "\n").encode("utf-8"))

    def sha(p):
        return hashlib.sha256(open(p, "rb").read()).hexdigest()

    train_pkgs = sorted({d["package"] for d in train})
    held_kinds = {}
    for c in contexts:
        for k in c["kinds"]:
            held_kinds[k] = held_kinds.get(k, 0) + 1
    manifest = {
        "built_by": "examples/traces/build_corpus.py",
        "machine": {"os_release": open("/etc/os-release").read().split("PRETTY_NAME=")[-1].split("\n")[0].strip('"')
                    if os.path.exists("/etc/os-release") else "?"},
        "dirs": ["/usr/share/common-licenses", "/usr/share/doc/*/ (copyright, changelog*, NEWS*, README* and other "
                 "doc-named or .txt/.md/.rst files)", "/usr/share/man/man*/ (English only, roff stripped)",
                 "/usr/share/perl/*, /usr/share/perl5, /usr/lib/x86_64-linux-gnu/perl*/* (.pod, .pm)",
                 "/usr/lib/python3.*, /usr/lib/python3/dist-packages (.py; no tests, no idlelib)"],
        "normalisation": "UTF-8 (else Latin-1), CR/FF to LF, control chars dropped, trailing blanks stripped, "
                         f">2 blank lines collapsed; docs < {MIN_DOC} B dropped; whole-doc dedup by sha1; "
                         f"paragraphs >= {PARA_DEDUP} B kept once",
        "split": "by Debian source package (dpkg status Source:); held-out packages chosen by sha1 order "
                 f"among those with >= {CTX_MIN} B of text, up to --heldout-mb; no package in both",
        "stats": stats,
        "documents_total": len(docs),
        "packages_total": len(by_pkg),
        "train": {"file": "train.bin.gz", "separator": "one NUL byte between documents", "documents": len(train),
                  "packages": len(train_pkgs), "bytes": total, "bytes_by_kind": kind_bytes,
                  "kind_caps_mb": KIND_CAPS_MB, "cap_mb": args.train_cap_mb, "dropped_by_caps_bytes": dropped,
                  "gzip_bytes": os.path.getsize(train_path), "sha256": sha(train_path)},
        "heldout": {"file": "heldout.jsonl.gz", "contexts": len(contexts), "packages": held_pkgs,
                    "bytes": sum(c["bytes"] for c in contexts),
                    "context_bytes_min_max": [min((c["bytes"] for c in contexts), default=0),
                                              max((c["bytes"] for c in contexts), default=0)],
                    "contexts_with_kind": held_kinds,
                    "contexts_ge_32KiB": sum(c["bytes"] >= 32768 for c in contexts),
                    "gzip_bytes": os.path.getsize(held_path), "sha256": sha(held_path)},
    }
    assert not set(train_pkgs) & held_set
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=False)
        f.write("\n")
    print(json.dumps({k: manifest[k] for k in ("documents_total", "packages_total")}
                     | {"train": {k: manifest["train"][k] for k in ("documents", "packages", "bytes", "bytes_by_kind", "gzip_bytes")},
                        "heldout": {k: manifest["heldout"][k] for k in ("contexts", "bytes", "contexts_ge_32KiB", "gzip_bytes")},
                        "seconds": round(time.time() - t0, 1)}))


if __name__ == "__main__":
    main()
