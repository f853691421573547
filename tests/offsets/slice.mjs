// slice.mjs -- the daemon's offsets as JavaScript counts them. The API
// counts characters (Unicode code points, as Python's str and OpenAI do);
// a JavaScript string counts UTF-16 code units, which differ after a
// character beyond the BMP (an emoji: two units, one code point). So
// `Array.from(text)` indexes as the API does, `text.slice(o)` only before
// the first such character, and `cpToUtf16(text, o)` converts (docs/api.md,
// "Offsets"). Run by tests/test_normalize_server.c against the demo model:
// node tests/offsets/slice.mjs PORT. Prints "N passed, N failed".
const PORT = process.argv[2];
const PROMPT = 'A naïve café owner in 東京 😀 said: “hello”.\nThe café rose 5%.';
const WANT = [['a', 'A'], ['naive', 'naïve'], ['cafe', 'café'], ['owner', 'owner'], ['in', 'in'], ['東京', '東京'],
              ['said', 'said'], ['hello', 'hello'], ['<eos>', '.'], ['the', 'The'], ['cafe', 'café'],
              ['rose', 'rose'], ['N', '5'], ['<eos>', '.']];
const EMOJI_AT = Array.from(PROMPT).indexOf('😀');   // in code points

let passed = 0, failed = 0;
function check(cond, what) {
    if (cond) passed++;
    else { failed++; console.log(`FAIL ${what}`); }
}

async function post(path, body) {
    const r = await fetch(`http://127.0.0.1:${PORT}${path}`, {
        method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
    return r.json();
}

/* A code-point offset of text as an index into the JavaScript string. */
function cpToUtf16(text, o) {
    return Array.from(text).slice(0, o).join('').length;
}

async function main() {
    const t = await post('/tokenize', { prompt: PROMPT });
    const cps = Array.from(PROMPT);
    check(t.words.length === WANT.length, `/tokenize: ${t.words.length} tokens`);
    WANT.forEach(([w, src], i) => {
        const o = t.offsets[i], n = t.lengths[i];
        check(t.words[i] === w && cps.slice(o, o + n).join('') === src,
              `token ${i} '${t.words[i]}': Array.from slice '${cps.slice(o, o + n).join('')}', want '${src}'`);
        check(PROMPT.slice(cpToUtf16(PROMPT, o), cpToUtf16(PROMPT, o + n)) === src, `token ${i}: cpToUtf16`);
        // the string's own slice agrees before the emoji, is one unit short after it
        const own = PROMPT.slice(o, o + n);
        check(o < EMOJI_AT ? own === src : own !== src && PROMPT.slice(o + 1, o + 1 + n) === src,
              `token ${i} at ${o}: String.prototype.slice gives '${own}' (emoji at ${EMOJI_AT})`);
    });
    check(t.unk.filter(Boolean).length === t.unk_count && t.unk[1] === true && t.unk[0] === false, '/tokenize unk');

    // completions' text_offset: the same code points, generated words too
    const c = await post('/v1/completions', { prompt: PROMPT, echo: true, logprobs: 0, max_tokens: 3, temperature: 0 });
    const ch = c.choices[0], lp = ch.logprobs, text = Array.from(ch.text);
    check(lp.tokens.length === WANT.length + 3 && lp.unk.length === lp.tokens.length, 'completion tokens and unk');
    lp.tokens.forEach((w, i) => {
        const at = text.slice(lp.text_offset[i]).join('');
        const src = i < WANT.length ? WANT[i][1] : w === '<eos>' ? '\n' : w;
        check(at.startsWith(src), `text_offset[${i}] ${lp.text_offset[i]}: '${at.slice(0, 8)}', want '${src}'`);
    });
}

main().catch(e => { failed++; console.log(`FAIL ${e.stack || e}`); })
      .finally(() => { console.log(`${passed} passed, ${failed} failed`); process.exit(failed ? 1 : 0); });
