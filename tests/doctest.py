#!/usr/bin/env python3
"""doctest.py -- the documents' examples run as written.

Every fenced block opened with ```sh doctest in the given Markdown files is
run, in document order, by one bash per file (so a variable set in one block,
such as the README's SID, is there in the next), from the repository root,
against a daemon on --port: the documents' localhost:8080 and 127.0.0.1:8080
become that port. A command is a line that is not a comment, with its
continuation lines (ending in \\, | or &&); the lines right after it that
start with "#> " are its expected output, one "#> " line per output line.
Other comments are prose and are not checked, nor is standard error (a
failing command's report quotes the end of it).

Expected output is compared line by line:
  * a line that parses as JSON is compared as JSON: an object shown has
    exactly the answer's keys (none left out, none added: pick keys with
    jq to show fewer), with values that match; arrays have the length
    shown, unless their last element is the string "..." (then the shown
    elements are a prefix);
    a string ending in "…" matches any string with that prefix (ids), and
    "…" alone any value (a number that changes from run to run: a time);
    numbers match within a relative 1e-4 (+ 1e-6 absolute): the demo
    model's answers are deterministic up to float32 summation order
    (SIMD level, thread count, batch shape: relative differences of order
    1e-6, tests/tolerance.h), and a wrong answer differs in the 2nd-3rd digit;
  * any other line is compared as text: the numbers in the line match
    within the same tolerance and the rest exactly; "…" matches any run of
    characters, except right after a digit, where it stands for the
    number's further digits: "0.43260…" (a number shown to the digits that
    do not depend on the CPU) matches a number within one unit of its last
    digit shown, so {"word":"N","prob":0.43260…} still has exactly its keys.
A command without "#> " lines must only exit 0.

--regen rewrites the "#> " lines that do not match with the real output
(lines that match are kept, with their "…"), for a human to review; with
--exact it also rewrites those that match only within the tolerance, so
the documents show what prints, digit for digit (lines with "…" are kept
when they match).

The code's citations of docs/design.md ("design §N") must name its
sections, and every relative link of the files is checked too: the file exists, and so
does the heading its #fragment names.

Prints one line per command or link that fails, and "N passed, N failed"
(one check per command run and per link).
"""
import argparse
import json
import os
import re
import subprocess
import sys

MARK = "```sh doctest"
REL_TOL, ABS_TOL = 1e-4, 1e-6
NUM = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"   # a number in a line of text


def parse(path):
    """[(line_index, command_text, [expected lines], [indices of #> lines])]"""
    lines = open(path, encoding="utf-8").read().split("\n")
    cmds, i, inblock = [], 0, False
    while i < len(lines):
        ln = lines[i]
        if not inblock:
            inblock = ln.strip() == MARK
            i += 1
            continue
        if ln.strip().startswith("```"):
            inblock = False
            i += 1
            continue
        s = ln.strip()
        if not s or s.startswith("#"):
            i += 1
            continue
        start, parts = i, [ln]
        while re.search(r"(\\|\||&&)\s*$", lines[i]) and i + 1 < len(lines):
            i += 1
            parts.append(lines[i])
        i += 1
        exp, idx = [], []
        while i < len(lines) and lines[i].startswith("#>"):
            exp.append(lines[i][3:] if lines[i].startswith("#> ") else lines[i][2:])
            idx.append(i)
            i += 1
        cmds.append((start, "\n".join(parts), exp, idx))
    return lines, cmds


def json_match(want, got, path="$"):
    """None when got matches want, else a short reason."""
    if want == "…":
        return None
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return f"{path}: expected an object, got {json.dumps(got)[:80]}"
        extra = [k for k in got if k not in want]
        if extra:
            return f"{path}: key '{extra[0]}' is in the answer, not in the document"
        for k, v in want.items():
            if k not in got:
                return f"{path}: no key '{k}'"
            r = json_match(v, got[k], f"{path}.{k}")
            if r:
                return r
        return None
    if isinstance(want, list):
        if not isinstance(got, list):
            return f"{path}: expected an array, got {json.dumps(got)[:80]}"
        prefix = bool(want) and want[-1] == "..."
        items = want[:-1] if prefix else want
        if (len(got) < len(items)) if prefix else (len(got) != len(items)):
            return f"{path}: {len(got)} elements, expected {'at least ' if prefix else ''}{len(items)}"
        for j, v in enumerate(items):
            r = json_match(v, got[j], f"{path}[{j}]")
            if r:
                return r
        return None
    if isinstance(want, bool) or want is None:
        return None if got is want else f"{path}: {json.dumps(got)} != {json.dumps(want)}"
    if isinstance(want, (int, float)):
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return f"{path}: expected a number, got {json.dumps(got)[:80]}"
        if abs(got - want) <= ABS_TOL + REL_TOL * abs(want):
            return None
        return f"{path}: {got} != {want}"
    if isinstance(want, str):
        if want.endswith("…") and isinstance(got, str) and got.startswith(want[:-1]):
            return None
        return None if got == want else f"{path}: {json.dumps(got)[:80]} != {json.dumps(want)[:80]}"
    return f"{path}: unexpected {want!r}"


def line_match(want, got):
    try:
        w = json.loads(want)
        if isinstance(w, (dict, list)):
            try:
                g = json.loads(got)
            except ValueError:
                return f"not JSON: {got[:100]}"
            return json_match(w, g)
    except ValueError:
        pass
    if "…" not in want:
        # text with numbers in it (a TSV line): the words exact, the numbers within the tolerance
        wp, gp = re.split(NUM, want.rstrip()), re.split(NUM, got.rstrip())
        wn, gn = re.findall(NUM, want), re.findall(NUM, got)
        if wp == gp and len(wn) == len(gn) and all(num_match(w, g) for w, g in zip(wn, gn)):
            return None
        return f"{got[:120]!r} != {want[:120]!r}"
    # "…": right after a digit, the number's further digits (the number is
    # shown to the digits that do not depend on the CPU); elsewhere any run
    # of characters. Numbers match within the tolerance, a number shown
    # with "…" within one unit of its last digit shown.
    parts, pat, nums = re.split(r"(" + NUM + r"…?|…)", want.rstrip()), "^", []
    for j, part in enumerate(parts):
        if j % 2 == 0:
            pat += re.escape(part)
        elif part == "…":
            pat += ".*?"
        else:
            pat += "(" + NUM + ")"
            nums.append(part)
    m = re.match(pat + "$", got.rstrip(), re.S)
    if m and all(num_match(w, g) for w, g in zip(nums, m.groups())):
        return None
    return f"{got[:120]!r} != {want[:120]!r}"


def num_match(want, got):
    """A number of an expected line against the one printed: within the
    tolerance; shown with a trailing "…", within one unit of its last digit."""
    w, g = float(want.rstrip("…")), float(got)
    if want.endswith("…"):
        mant = re.sub(r"[eE].*", "", want.rstrip("…"))
        exp = int(re.sub(r"^[^eE]*[eE]?", "", want.rstrip("…")) or 0)
        unit = 10.0 ** (exp - (len(mant.split(".")[1]) if "." in mant else 0))
        return abs(g - w) < unit
    return abs(g - w) <= ABS_TOL + REL_TOL * abs(w)


def exact_match(want, got):
    """--exact: the line as it prints, or a line with "…" that matches."""
    if "…" in want:
        return line_match(want, got)
    return None if want.rstrip() == got.rstrip() else f"{got[:120]!r} != {want[:120]!r} (--exact)"


def run_file(path, port, root, regen, exact=False):
    lines, cmds = parse(path)
    if not cmds:
        return 0, 0
    # one bash: each command's output between markers, its status after it
    script = ["cd " + json.dumps(root)]
    for n, (_, cmd, _, _) in enumerate(cmds):
        cmd = re.sub(r"(localhost|127\.0\.0\.1):8080\b", r"\g<1>:" + str(port), cmd)
        if os.environ.get("NEUROCACHE_BIN"):   # the binaries under test (make asan's too)
            cmd = re.sub(r"(?<![\w/.])bin/neurocache", os.environ["NEUROCACHE_BIN"] + "/neurocache", cmd)
        script.append(f"printf '\\n@@doctest-begin {n}\\n'")
        script.append(cmd)
        script.append(f"printf '\\n@@doctest-end {n} %d\\n' $?")
    env = dict(os.environ, NC_PORT=str(port))
    p = subprocess.run(["bash", "-c", "\n".join(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                       timeout=600)
    err_tail = " | ".join(p.stderr.decode("utf-8", "replace").strip().split("\n")[-3:])
    out = p.stdout.decode("utf-8", "replace")
    got = {}
    for m in re.finditer(r"@@doctest-begin (\d+)\n(.*?)\n@@doctest-end \1 (\d+)\n", out, re.S):
        body = m.group(2)
        got[int(m.group(1))] = ([ln for ln in body.split("\n") if ln != ""], int(m.group(3)))
    npass = nfail = 0
    edits = {}
    for n, (start, cmd, exp, idx) in enumerate(cmds):
        where = f"{path}:{start + 1}"
        first = cmd.split("\n")[0][:70]
        if n not in got:
            print(f"FAIL {where}: {first}: no output (the shell stopped before it)")
            nfail += 1
            continue
        outl, rc = got[n]
        reason = None
        if rc != 0:
            reason = f"exit status {rc}: {' | '.join(outl)[:300]} (stderr ends: {err_tail[:300]})"
        elif exp and len(outl) != len(exp):
            reason = f"{len(outl)} output lines, the document shows {len(exp)}: {' | '.join(outl)[:300]}"
        else:
            for w, g in zip(exp, outl):
                r = exact_match(w, g) if exact else line_match(w, g)
                if r:
                    reason = r
                    break
        if reason:
            print(f"FAIL {where}: {first}: {reason}")
            nfail += 1
            if regen and rc == 0 and exp:
                same = exact_match if exact else line_match
                keep = [w if j < len(outl) and not same(w, outl[j]) else None for j, w in enumerate(exp)]
                new = [keep[j] if j < len(keep) and keep[j] is not None else g for j, g in enumerate(outl)]
                edits[n] = new
        else:
            npass += 1
    if regen and edits:
        newlines, skip = [], set()
        for n, new in edits.items():
            skip.update(cmds[n][3])
        for i, ln in enumerate(lines):
            if i in skip:
                continue
            newlines.append(ln)
            for n, new in edits.items():
                idx = cmds[n][3]
                if idx and i == idx[0] - 1:
                    newlines.extend("#> " + g for g in new)
        open(path, "w", encoding="utf-8").write("\n".join(newlines))
        print(f"regen: rewrote {len(edits)} outputs in {path}")
    return npass, nfail


def slug(title):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces -> '-'."""
    t = re.sub(r"[`*_]", "", title.strip().lower())
    t = re.sub(r"[^\w\- ]", "", t)
    return t.replace(" ", "-")


def anchors(path):
    out, fence = set(), False
    for ln in open(path, encoding="utf-8"):
        if ln.startswith("```"):
            fence = not fence
        elif not fence and ln.startswith("#"):
            out.add(slug(ln.lstrip("#")))
    return out


def check_links(path):
    """Every relative link of the document names a file that exists, and a
    heading of it when it has a #fragment. Returns (passed, failed)."""
    text = re.sub(r"```.*?```", "", open(path, encoding="utf-8").read(), flags=re.S)
    npass = nfail = 0
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue
        file, _, frag = target.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        reason = None
        if not os.path.exists(full):
            reason = "no such file"
        elif frag and full.endswith(".md") and frag not in anchors(full):
            reason = f"no heading '#{frag}' in {full}"
        if reason:
            print(f"FAIL {path}: link ({target}): {reason}")
            nfail += 1
        else:
            npass += 1
    return npass, nfail


def check_design_cites(root):
    """Code comments cite docs/design.md as "design §N" (also "§N-§M",
    "§N, §M"): every section cited must be a "## N." heading there."""
    heads = set(re.findall(r"^## (\d+)\.", open(os.path.join(root, "docs/design.md"), encoding="utf-8").read(), re.M))
    cited = {}
    for top in ("core", "store", "proto", "server", "tools", "tests", "scripts", "deploy", "web", "config"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for fn in files:
                fp = os.path.join(dirpath, fn)
                try:
                    text = open(fp, encoding="utf-8").read()
                except (UnicodeDecodeError, OSError):
                    continue
                for m in re.finditer(r"design[^§\n]{0,12}((?:§ ?\d+[^§\n]{0,4})+)", text):
                    for n in re.findall(r"§ ?(\d+)", m.group(1)):
                        cited.setdefault(n, os.path.relpath(fp, root))
    npass = nfail = 0
    for n, where in sorted(cited.items()):
        if n in heads:
            npass += 1
        else:
            print(f"FAIL {where} cites design §{n}: docs/design.md has no section {n}")
            nfail += 1
    return npass, nfail


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--regen", action="store_true")
    ap.add_argument("--exact", action="store_true", help="outputs must be as they print (numbers too)")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    root = os.getcwd()
    tp = tf = 0
    for f in a.files:
        p, fl = run_file(f, a.port, root, a.regen, a.exact)
        lp, lf = check_links(f)
        p, fl = p + lp, fl + lf
        print(f"{f}: {p} passed, {fl} failed")
        tp, tf = tp + p, tf + fl
    p, fl = check_design_cites(root)
    print(f"design § cited in the code: {p} passed, {fl} failed")
    tp, tf = tp + p, tf + fl
    print(f"{tp} passed, {tf} failed")
    return 1 if tf else 0


if __name__ == "__main__":
    sys.exit(main())
