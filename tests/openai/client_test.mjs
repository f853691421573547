// client_test.mjs -- the daemon driven by the official `openai` npm client
// (pinned in package.json / package-lock.json, installed by scripts/deps.sh
// into build/node-openai): models.list, completions with echo and logprobs
// (text_offset in characters, our per-token "unk" passed through),
// streaming with logprobs (concatenated = the whole answer at temperature
// 0), batched prompts, include_usage, and errors surfacing as the client's
// typed errors. Prints "N passed, N failed" (tests/test_openai_client.c
// adds the counts to its own). NC_URL: the daemon; NC_NODE_MODULES: where
// the client is installed.
import { createRequire } from 'node:module';
import path from 'node:path';

const require = createRequire(path.resolve(process.env.NC_NODE_MODULES || 'build/node-openai/node_modules', 'x.js'));
const { OpenAI } = require('openai');

let passed = 0, failed = 0;
function check(cond, what) {
    if (cond) passed++;
    else { failed++; console.log(`FAIL ${what}`); }
}
const deepEq = (a, b) => JSON.stringify(a) === JSON.stringify(b);

const client = new OpenAI({ baseURL: `${process.env.NC_URL}/v1`, apiKey: 'unused', maxRetries: 0 });

async function main() {
    const models = await client.models.list();
    const model = models.data[0]?.id;
    check(typeof model === 'string' && model.length > 0, 'models.list names the model');

    // lm-eval's loglikelihood shape: echo, logprobs, max_tokens 0
    const echo = await client.completions.create({ model, prompt: 'w1 w2 w3 w4', echo: true, logprobs: 1, max_tokens: 0 });
    const lp = echo.choices[0].logprobs;
    check(echo.choices[0].text === 'w1 w2 w3 w4', 'echo returns the prompt');
    check(lp.tokens.length === 4 && lp.token_logprobs[0] === null && lp.token_logprobs.slice(1).every(x => x < 0),
          'echo logprobs: null first, negative after');

    // text_offset counts characters (code points), as OpenAI does: with
    // accents, CJK and an emoji (two UTF-16 units) before the tokens,
    // Array.from(prompt) slices each; "unk" (ours, beside OpenAI's lists)
    // flags the words the model does not know; the client passes it through
    const uprompt = 'naïve café 東京 😀 w1 w2';
    const u = await client.completions.create({ model, prompt: uprompt, echo: true, logprobs: 0, max_tokens: 0 });
    const ul = u.choices[0].logprobs, cps = Array.from(uprompt);
    check(deepEq(ul.tokens, ['naïve', 'café', '東京', '😀', 'w1', 'w2']), `tokens ${JSON.stringify(ul.tokens)}`);
    check(ul.tokens.every((t, i) => cps.slice(ul.text_offset[i], ul.text_offset[i] + Array.from(t).length).join('') === t),
          `text_offset ${JSON.stringify(ul.text_offset)} slices the prompt's characters`);
    check(deepEq(ul.unk, [true, true, true, true, false, false]), `unk ${JSON.stringify(ul.unk)}`);

    // streaming with logprobs equals the whole answer at temperature 0
    const req = { model, prompt: 'w5 w6', max_tokens: 12, temperature: 0, logprobs: 2 };
    const whole = await client.completions.create(req);
    const stream = await client.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
    let text = '', tokens = [], lps = [], tops = [], finish = null, usage = null, chunks = 0;
    for await (const chunk of stream) {
        chunks++;
        if (chunk.usage) usage = chunk.usage;
        for (const c of chunk.choices) {
            text += c.text;
            if (c.logprobs) {
                tokens.push(...c.logprobs.tokens);
                lps.push(...c.logprobs.token_logprobs);
                tops.push(...c.logprobs.top_logprobs);
            }
            if (c.finish_reason) finish = c.finish_reason;
        }
    }
    const w = whole.choices[0];
    check(chunks >= 12, `streamed in ${chunks} chunks`);
    check(text === w.text, `streamed text '${text}' = whole '${w.text}'`);
    check(deepEq(tokens, w.logprobs.tokens) && deepEq(lps, w.logprobs.token_logprobs) && deepEq(tops, w.logprobs.top_logprobs),
          'streamed logprobs = whole');
    check(finish === w.finish_reason, 'finish_reason');
    check(usage && deepEq(usage, whole.usage), 'include_usage: the last chunk carries the usage');

    // batched prompts: one choice per prompt, by index; token ids accepted
    const batch = await client.completions.create({ model, prompt: ['w1 w2', 'w3', [3, 4, 5]], max_tokens: 3, temperature: 0 });
    check(batch.choices.length === 3 && batch.choices.map(c => c.index).join() === '0,1,2', 'batched prompts');
    check(batch.usage.completion_tokens === 9, 'batched usage');

    // a stop sequence: finish_reason "stop", text cut before it
    const free = await client.completions.create({ model, prompt: 'w5 w6', max_tokens: 12, temperature: 0 });
    const words = free.choices[0].text.trim().split(/\s+/);
    if (words.length >= 3) {
        const stop = ' ' + words[2];
        const cut = await client.completions.create({ model, prompt: 'w5 w6', max_tokens: 12, temperature: 0, stop: [stop] });
        check(cut.choices[0].finish_reason === 'stop' && free.choices[0].text.startsWith(cut.choices[0].text) &&
              !cut.choices[0].text.includes(stop), `stop '${stop}'`);
    } else {
        check(false, 'three words to stop at');
    }

    // errors as the client's typed errors
    try {
        await client.completions.create({ model, prompt: 'w1', max_tokens: -1 });
        check(false, 'max_tokens -1 refused');
    } catch (e) {
        check(e instanceof OpenAI.BadRequestError && e.status === 400 && e.error?.code === 'out_of_range',
              `BadRequestError (${e.constructor.name} ${e.status})`);
    }
    try {
        await client.completions.create({ model, prompt: 'w1', max_tokens: 1000000 });
        check(false, 'max_tokens over the limit refused');
    } catch (e) {
        check(e instanceof OpenAI.APIError && e.status >= 400 && e.status < 500, `APIError ${e.status}`);
    }
    try {
        await client.completions.create({ model, prompt: [[1, 2, 99999]], max_tokens: 1 });
        check(false, 'token id out of range refused');
    } catch (e) {
        check(e instanceof OpenAI.BadRequestError, `token id out of range: ${e.constructor.name}`);
    }
    try {
        const s = await client.completions.create({ model, prompt: 'w1', max_tokens: 1, stream: true, temperature: -1 });
        for await (const _ of s) { /* nothing */ }
        check(false, 'a bad streamed request refused');
    } catch (e) {
        check(e instanceof OpenAI.BadRequestError, `streamed bad request: ${e.constructor.name}`);
    }
}

main().catch(e => { failed++; console.log(`FAIL ${e.stack || e}`); })
      .finally(() => { console.log(`${passed} passed, ${failed} failed`); process.exit(failed ? 1 : 0); });
