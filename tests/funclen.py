#!/usr/bin/env python3
"""funclen.py -- lengths of the C function definitions in the given files.

Prints one line per function: "LINES FILE:LINE NAME REASON", REASON being
the text after "long:" in the comment just above the definition (or "-").
LINES counts from the line of the function's name to its closing brace.
With --params first: "PARAMS FILE:LINE NAME" instead, PARAMS the number of
parameters of the definition (f(void) has 0, "..." counts as one).
A definition is a top-level "name(...) {" outside comments and literals;
initialisers ("= {"), struct, union and enum bodies are not functions."""
import re
import sys


def blank(src):
    """Comments and string/char literals replaced by spaces (newlines kept),
    so braces and parentheses inside them do not count."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith('/*', i):
            j = src.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r'[^\n]', ' ', src[i:j]))
            i = j
        elif src.startswith('//', i):
            j = src.find('\n', i)
            j = n if j < 0 else j
            out.append(' ' * (j - i))
            i = j
        elif c in '"\'':
            j = i + 1
            while j < n and src[j] != c and src[j] != '\n':
                j += 2 if src[j] == '\\' else 1
            j = min(j + 1, n)
            out.append(c + ' ' * (j - i - 2) + c if j - i >= 2 else src[i:j])
            i = j
        elif c == '#' and (i == 0 or src[i - 1] == '\n'):
            j = i
            while True:  # a preprocessor line, with its continuations
                k = src.find('\n', j)
                if k < 0:
                    k = n
                    break
                if src[k - 1] != '\\':
                    break
                j = k + 1
            out.append(re.sub(r'[^\n]', ' ', src[i:k]))
            i = k
        else:
            out.append(c)
            i += 1
    return ''.join(out)


def closing_brace(b, i):
    """Index of the '}' that closes the '{' at b[i] (len(b) if none)."""
    d = 0
    for j in range(i, len(b)):
        if b[j] == '{':
            d += 1
        elif b[j] == '}':
            d -= 1
            if d == 0:
                return j
    return len(b)


def count_params(plist):
    """Parameters in the text between a definition's parentheses: commas at
    nesting depth 0 (a function-pointer or array parameter's own
    parentheses and brackets hold commas that do not count) plus one;
    empty or "void" is 0."""
    body = plist.strip()
    if body in ('', 'void'):
        return 0
    return len(split_top(body))


def split_top(text, opens='([{', closes=')]}'):
    """text split at the commas outside the brackets opens/closes."""
    parts, depth, cur = [], 0, ''
    for c in text:
        if c in opens:
            depth += 1
        elif c in closes:
            depth -= 1
        if c == ',' and depth == 0:
            parts.append(cur)
            cur = ''
        else:
            cur += c
    return parts + [cur]


def functions(path):
    src = open(path, encoding='utf-8', errors='replace').read()
    b = blank(src)
    lines = src.split('\n')
    depth, i, n = 0, 0, len(b)
    while i < n:
        c = b[i]
        if c == '{':
            if depth == 0:
                head = b[max(0, i - 2000):i]
                m = re.search(r'(\w+)\s*\(([^()]|\([^()]*\))*\)\s*$', head)
                kw = re.search(r'(=|\b(struct|union|enum)\b[^;)]*)\s*$', head)
                if m and not kw and m.group(1) not in ('if', 'for', 'while', 'switch', 'sizeof'):
                    start = b.count('\n', 0, i - len(head) + m.start(1)) + 1
                    j = closing_brace(b, i)
                    end = b.count('\n', 0, j) + 1
                    # the comment block just above (and the signature lines)
                    k, above = start - 2, []
                    sig = '\n'.join(lines[start - 1:b.count('\n', 0, i) + 1])
                    while k >= 0 and (lines[k].strip().startswith(('/*', '*', '//')) or lines[k].strip().endswith('*/')):
                        above.append(lines[k])
                        k -= 1
                    text = '\n'.join(reversed(above)) + '\n' + sig
                    r = re.search(r'long:\s*([^*\n]*)', text)
                    sig_b = m.group(0)
                    plist = sig_b[sig_b.index('(') + 1:sig_b.rindex(')')]
                    yield (end - start + 1, start, m.group(1), (r.group(1).strip() if r else '-'),
                           count_params(plist))
                    i = j + 1
                    continue
            depth += 1
        elif c == '}':
            depth -= 1
        i += 1


if __name__ == '__main__':
    args = sys.argv[1:]
    params = args[:1] == ['--params']
    for p in args[1:] if params else args:
        for ln, start, name, why, npar in functions(p):
            if params:
                print(npar, '%s:%d' % (p, start), name)
            else:
                print(ln, '%s:%d' % (p, start), name, why)
