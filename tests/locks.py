#!/usr/bin/env python3
"""locks.py -- every mutex and rwlock declared in the given C files, one per
line: "NAME FILE KIND", NAME being "struct.field" for a member ("watchdog.lock"
for a member of a static anonymous struct variable) or the variable's name
for a lone lock. Condition variables are not locks and are not listed.
With --tls first: every thread-local variable defined in the files instead
(__thread, _Thread_local, C++ thread_local; extern declarations are not
definitions), one per line: "NAME FILE"."""
import re
import sys

sys.path.insert(0, __file__.rsplit('/', 1)[0])
from funclen import blank, closing_brace, split_top  # noqa: E402


def enclosing(b, pos):
    """Name of the innermost struct/union body around pos, or None."""
    depth, i = 0, pos
    while i > 0:
        i -= 1
        if b[i] == '}':
            depth += 1
        elif b[i] == '{':
            if depth == 0:
                head = b[max(0, i - 300):i]
                m = re.search(r'\bstruct\s+(\w+)\s*$', head)
                if m:
                    return m.group(1)
                if re.search(r'\b(struct|union)\s*$', head):
                    # anonymous: typedef struct {...} NAME; or static struct {...} var;
                    j = closing_brace(b, i)
                    m = re.match(r'\s*(\w+)', b[j + 1:])
                    return m.group(1) if m else '?'
                return None   # a function body: a local
            depth -= 1
    return None


def thread_locals(b):
    """Names of the thread-local variables defined in the blanked source b."""
    for m in re.finditer(r'\b(__thread|_Thread_local|thread_local)\b', b):
        start = b.rfind(';', 0, m.start())
        start = max(start, b.rfind('{', 0, m.start()), b.rfind('}', 0, m.start()))
        if re.search(r'\bextern\b', b[start + 1:m.start()]):
            continue
        i, decl = m.end(), ''
        while i < len(b) and b[i] != ';':
            if b[i] == '{':   # a struct body: skipped, its variable's name follows
                i = closing_brace(b, i) + 1
                continue
            decl += b[i]
            i += 1
        for part in split_top(decl, '([{<', ')]}>'):   # C++ template arguments too
            part = re.split(r'[\[=]', part)[0]
            names = re.findall(r'\w+', part)
            if names:
                yield names[-1]


if sys.argv[1:2] == ['--tls']:
    for path in sys.argv[2:]:
        b = blank(open(path, encoding='utf-8', errors='replace').read())
        for name in thread_locals(b):
            print('%s %s' % (name, path))
    sys.exit(0)

for path in sys.argv[1:]:
    b = blank(open(path, encoding='utf-8', errors='replace').read())
    for m in re.finditer(r'\bpthread_(mutex|rwlock)_t\s+([^;]*);', b):
        owner = enclosing(b, m.start())
        for decl in m.group(2).split(','):
            name = re.match(r'\s*\**\s*(\w+)', decl).group(1)
            print('%s %s %s' % ('%s.%s' % (owner, name) if owner else name, path, m.group(1)))
