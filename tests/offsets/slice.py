#!/usr/bin/env python3
# slice.py -- the daemon's offsets as Python counts them: every offset the
# API returns (/tokenize's and score's "offsets" and "lengths", a feed's
# with "scores", a hypothesis's in /v1/rescore, completions' "text_offset"
# of the echoed prompt and of the generated words) slices the token's
# characters out of the string sent with Python's own str[o:o + n], on a
# text with accents, CJK and an emoji (code points beyond the BMP), and
# each token says whether it is the model's unknown word ("unk"). Run by
# tests/test_normalize_server.c against the demo model (PTB conventions):
# python3 tests/offsets/slice.py PORT. Prints "N passed, N failed".
import json
import sys
import urllib.request

PORT = int(sys.argv[1])
PROMPT = "A naïve café owner in 東京 😀 said: “hello”.\nThe café rose 5%."
# per token: the word the model reads, the characters it came from, unk
WANT = [("a", "A", False), ("naive", "naïve", True), ("cafe", "café", True), ("owner", "owner", False),
        ("in", "in", False), ("東京", "東京", True), ("said", "said", False), ("hello", "hello", True),
        ("<eos>", ".", False), ("the", "The", False), ("cafe", "café", True), ("rose", "rose", False),
        ("N", "5", False), ("<eos>", ".", False)]

passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL", what)


def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())


def check_listed(route, o, text, words_key):
    """o lists tokens with offsets, lengths and unk into text."""
    words, offs, lens, unk = o[words_key], o["offsets"], o["lengths"], o["unk"]
    check(len(words) == len(WANT) and len(offs) == len(lens) == len(unk) == len(words),
          f"{route}: {len(words)} tokens, want {len(WANT)}: {words}")
    for i, (w, src, u) in enumerate(WANT[:len(words)]):
        got = text[offs[i]:offs[i] + lens[i]]
        check(words[i] == w and got == src, f"{route} token {i}: {words[i]!r} from {got!r}, want {w!r} from {src!r}")
        check(unk[i] is u, f"{route} token {i} {words[i]!r}: unk {unk[i]}, want {u}")
    check(o["unk_count"] == sum(u for _, _, u in WANT), f"{route}: unk_count {o['unk_count']}")


check_listed("/tokenize", post("/tokenize", {"prompt": PROMPT}), PROMPT, "words")
check_listed("/v1/score", post("/v1/score", {"text": PROMPT}), PROMPT, "tokens")
sid = post("/v1/sessions", {})["id"]
check_listed("feed", post(f"/v1/sessions/{sid}/feed", {"text": PROMPT, "scores": True}), PROMPT, "tokens")
hyp = post("/v1/rescore", {"context": "the", "hypotheses": [PROMPT]})["hypotheses"][0]
check_listed("/v1/rescore", hyp, PROMPT, "tokens")

# completions: the echoed prompt's text_offset point at each token's
# characters in the prompt; the generated words' at themselves in the text
c = post("/v1/completions", {"prompt": PROMPT, "echo": True, "logprobs": 0, "max_tokens": 4, "temperature": 0})
ch = c["choices"][0]
lp, text = ch["logprobs"], ch["text"]
check(text.startswith(PROMPT), "echo: the text starts with the prompt")
n = len(WANT)
check(len(lp["tokens"]) == n + 4 and len(lp["text_offset"]) == n + 4 and len(lp["unk"]) == n + 4,
      f"completion: {len(lp['tokens'])} tokens")
for i, (w, src, u) in enumerate(WANT):
    o = lp["text_offset"][i]
    check(PROMPT[o:].startswith(src), f"text_offset[{i}] = {o}: {PROMPT[o:o + 8]!r}, want {src!r}")
    check(lp["unk"][i] is u, f"completion unk[{i}]")
for i in range(n, len(lp["tokens"])):
    o, w = lp["text_offset"][i], lp["tokens"][i]
    check(o >= len(PROMPT) and (text[o:].startswith(w) or (w == "<eos>" and text[o] == "\n")),
          f"generated text_offset[{i}] = {o}: {text[o:o + 8]!r}, token {w!r}")
    check(lp["unk"][i] is False, f"generated token {i} is not unk")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
