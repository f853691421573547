/* app.js -- neurocache's page. Uses only the public HTTP API (proto/openapi.yaml),
 * each call with "Authorization: Bearer <key>" when a key is typed. No framework:
 * four small views over fetch() and the DOM. */
'use strict';

const COMPONENTS = ['model', 'unigram', 'neural', 'unbounded', 'uniform'];
const $ = (sel) => document.querySelector(sel);
const params = new URLSearchParams(location.search);
/* characters of text per feed in the surprisal map (cut at white space) */
const MAP_CHUNK = Math.max(40, Number(params.get('chunk')) || 4000);

const state = {
  model: null,          // GET /v1/model
  ta: { sid: null, fed: '', key: '', busy: false, dirty: false, preds: [], unk: [] },
};

/* ---- API ------------------------------------------------------------------ */

class ApiError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

function apiKey() { return $('#api-key').value.trim(); }

/* One API call: JSON in and out; a non-2xx answer throws ApiError carrying the
 * server's own code and message. opts.raw: body sent as is with opts.type. */
async function api(method, path, body, opts = {}) {
  const headers = {};
  const key = apiKey();
  if (key) headers.Authorization = 'Bearer ' + key;
  let payload;
  if (opts.raw !== undefined) {
    payload = opts.raw;
    headers['Content-Type'] = opts.type || 'text/plain';
  } else if (body !== undefined) {
    payload = JSON.stringify(body);
    headers['Content-Type'] = 'application/json';
  }
  let r;
  try {
    r = await fetch(path, { method, headers, body: payload });
  } catch (e) {
    throw new ApiError(0, 'network', 'cannot reach the server: ' + e.message);
  }
  if (r.status === 204) return null;
  const text = await r.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch (e) { /* not JSON */ }
  if (!r.ok) {
    const err = json && json.error ? json.error : { code: 'http_' + r.status, message: text || r.statusText };
    throw new ApiError(r.status, err.code, err.message);
  }
  return json;
}

function showError(e) {
  const box = $('#error');
  if (!e) { box.hidden = true; box.textContent = ''; return; }
  box.hidden = false;
  box.textContent = e instanceof ApiError && e.status
    ? `${e.status} ${e.code}: ${e.message}` : String(e.message || e);
  box.dataset.code = e.code || '';
}

/* ---- model info and the cache settings form ------------------------------- */

async function loadModel() {
  try {
    state.model = await api('GET', '/v1/model');
  } catch (e) {
    state.model = null;
    $('#model-name').textContent = '?';
    showError(e);
    return false;
  }
  showError(null);
  const m = state.model;
  $('#model-name').textContent = m.name;
  $('#model-info').title = `${m.model_type}, ${m.num_layers}x${m.hidden_size}, vocabulary ${m.vocab_size}`;
  $('#model-detail').textContent = ` · V=${m.vocab_size} · ${m.num_layers}x${m.hidden_size} LSTM`;
  /* once: a new key keeps the settings the user chose */
  if (!$('#cache-form .field.cache')) buildForm(m.cache_knobs, m.cache_defaults);
  return true;
}

/* The settings panel, for people who are not language-model experts: one
 * group per cache, each saying in plain words what it does and when to turn
 * it on; each setting labelled in plain words, its name in the API only in
 * the fine print beside the server's own description (cache_knobs). The
 * fields come from the server: a setting this table does not know goes to
 * the group of the component the server lists it under (model.components),
 * or to "Other settings", labelled with the server's description.
 * main: the settings shown at once; the others are under "More settings". */
const GROUPS = [
  { id: 'neural', title: 'Recent contexts (neural cache)',
    plain: 'Remembers the last words of your text together with the context each one came in. When the ' +
           'text reaches a context like a remembered one, the word that followed it there becomes more likely: ' +
           'names and terms you used before come back.',
    when: 'Turn it on for any text longer than a few sentences, above all one that repeats its own names ' +
          'and words; a few hundred words remembered is a good start.',
    on: (c) => c.neural_size > 0, state: (c) => `${c.neural_size} words`,
    main: ['neural_size', 'neural_lambda'],
    labels: {
      neural_size: 'Words remembered (0 = off)',
      neural_lambda: 'How much the memory counts, from 0 (not at all) to 1 (alone)',
      neural_theta: 'How closely a context must match to count (higher = only close matches)',
      global_norm: 'Let the memory\'s own confidence set its weight, instead of the fixed share above',
      neural_alpha: 'Extra weight for the memory when its confidence sets it (negative = less)',
      neural_f16: 'Save memory: keep the contexts less precisely',
    } },
  { id: 'unigram', title: 'Recent words (unigram cache)',
    plain: 'Counts the words of the last stretch of your text, whatever their context, and makes the ' +
           'frequent ones more likely. A simpler and weaker cousin of the recent contexts above.',
    when: 'Turn it on when your text keeps using a small set of words, or to compare it with recent contexts.',
    on: (c) => c.unigram_size > 0, state: (c) => `${c.unigram_size} words`,
    main: ['unigram_size', 'unigram_lambda'],
    labels: {
      unigram_size: 'Words counted (0 = off)',
      unigram_lambda: 'How much the counts count, from 0 (not at all) to 1 (alone)',
    } },
  { id: 'unbounded', title: 'Uploaded documents (unbounded cache)',
    plain: 'Searches every text stored in a namespace (the documents uploaded on the Namespaces tab) for ' +
           'passages like the one you are writing, and makes the words that followed them there more likely. ' +
           'It holds any amount of text.',
    when: 'Turn it on once you have uploaded texts of the same kind as yours (same topic or style) into a ' +
          'namespace, and name that namespace here.',
    on: (c) => !!c.unbounded, state: () => `namespace ${namespace() || 'default'}`,
    main: ['unbounded', 'unbounded_lambda'],
    labels: {
      unbounded: 'Search the namespace\'s documents',
      unbounded_lambda: 'How much the documents count, from 0 (not at all) to 1 (alone)',
      knn: 'Passages compared for each word (more = slower, smoother)',
      nprobe: 'Parts of a large namespace searched (more = slower, more thorough)',
      kernel: 'How fast a passage\'s weight falls as it looks less alike',
      exact: 'Compare with every stored passage (exact, but slow on a large namespace)',
    } },
  { id: 'uniform', title: 'New words (open vocabulary)',
    plain: 'The model knows a fixed list of words and reads any other word as "an unknown word". With this ' +
           'on, the memories keep new words under their own spelling, so a name the model never learned can ' +
           'be predicted once it has appeared.',
    when: 'Turn it on when your text has many names or terms the model does not know (the surprisal map ' +
          'underlines them), together with one of the memories above.',
    on: (c) => !!c.open_vocab, state: () => 'on',
    main: ['open_vocab'],
    labels: {
      open_vocab: 'Remember new words by their spelling',
      uniform_mu: 'A small chance kept for any word at all, from 0 up to (not including) 1',
      vocab_size_full: 'How many possible words that chance is spread over (0 = counted for you)',
    } },
  { id: 'gate', title: 'Word-by-word mixing (gate)',
    plain: 'Normally the model and the memories are mixed in fixed shares. A gate is a small extra model ' +
           'that decides for each word how much to trust each memory, and can skip a document search that ' +
           'would not help.',
    when: 'Turn it on only if a gate was fitted for this model (with neurocache fit-gate); without one the ' +
          'server refuses it.',
    on: (c) => !!c.gate, state: () => 'on',
    main: ['gate'],
    labels: {
      gate: 'Let the gate mix the memories',
      gate_skip: 'Skip the document search when the gate expects it to count for less than this ' +
                 '(-1 = the gate\'s own choice, 0 = always search)',
    } },
  { id: 'dyneval', title: 'Learning from your text (dynamic evaluation)',
    plain: 'Keeps training the model a little on your own text as you write, every few words, so that it ' +
           'drifts towards your topic and style. The change stays in this session.',
    when: 'Turn it on for a long text of one kind. It needs the model\'s learning statistics (made once ' +
          'with neurocache dyn-stats) and takes more memory and time.',
    on: (c) => c.dyn_lr > 0, state: () => 'on',
    main: ['dyn_lr'],
    labels: {
      dyn_lr: 'Learning speed (0 = off; 0.002 is a good start)',
      dyn_decay: 'How fast what it learned fades back towards the trained model, at each step',
      dyn_segment: 'Words between two learning steps',
      dyn_params: 'How much of the model learns: from 0 (least, fastest) to 3 (all of it)',
    } },
];
const OTHER_GROUP = {
  plain: 'Settings of a part of the prediction this server was built with; the server describes each one ' +
         'in the fine print below it.',
  when: 'Leave them as they are unless you know what they do; turn it on with the settings below.',
  main: [], labels: {},
};

/* "0 to 1,000,000" etc.: a range in words */
function rangeText(r) {
  const n = (v) => Number(v).toLocaleString('en');
  if (r.enum) return 'one of ' + r.enum.join(', ');
  if (r.type === 'boolean') return 'on or off';
  return `${n(r.minimum)} to ${n(r.maximum)}${r.exclusive_maximum ? ' (not included)' : ''}`;
}
function defaultText(v) { return typeof v === 'boolean' ? (v ? 'on' : 'off') : String(v); }

/* One field: a plain label, the control, and the fine print (the setting's
 * name in the API, the server's description, its range and default). */
function knobField(name, r, def, label) {
  const field = document.createElement('label');
  field.className = 'field cache';
  field.dataset.knob = name;
  const text = document.createElement('span');
  text.className = 'plain-label';
  text.textContent = label;
  let input;
  if (r.type === 'boolean') {
    input = document.createElement('input');
    input.type = 'checkbox';
    input.checked = !!def;
    field.classList.add('check');
  } else if (r.enum) {
    input = document.createElement('select');
    for (const v of r.enum) input.add(new Option(v, v, false, v === def));
  } else {
    input = document.createElement('input');
    input.type = 'number';
    input.min = r.minimum;
    input.max = r.maximum;
    input.step = r.type === 'integer' ? '1' : 'any';
    input.value = def;
  }
  input.name = name;
  input.dataset.type = r.enum ? 'enum' : r.type;
  const detail = document.createElement('small');
  detail.className = 'knob-detail';
  detail.append(Object.assign(document.createElement('code'), { textContent: name }), ': ' +
    `${r.description || ''} (${rangeText(r)}; default ${defaultText(def)})`);
  field.append(text, input, detail);
  return field;
}

function groupBox(g, id) {
  const box = document.createElement('fieldset');
  box.className = 'group';
  box.dataset.group = id;
  const legend = document.createElement('legend');
  legend.append(g.title, ' ', Object.assign(document.createElement('span'), { className: 'state' }));
  box.append(legend,
    Object.assign(document.createElement('p'), { className: 'plain', textContent: g.plain }),
    Object.assign(document.createElement('p'), { className: 'when', textContent: g.when }),
    Object.assign(document.createElement('div'), { className: 'fields' }));
  const more = document.createElement('details');
  more.className = 'more';
  more.append(Object.assign(document.createElement('summary'), { textContent: 'More settings' }),
              Object.assign(document.createElement('div'), { className: 'fields' }));
  box.append(more);
  return box;
}

function buildForm(ranges, defaults) {
  const form = $('#cache-form');
  form.textContent = '';
  const comps = (state.model && state.model.components) || [];
  const boxes = new Map();
  const groupOf = (name) => {
    const known = GROUPS.find((g) => name in g.labels);
    if (known) return known;
    const c = comps.find((x) => (x.knobs || []).includes(name));
    const id = c ? c.name : 'other';
    return Object.assign({ id, title: c ? `The ${c.name} component` : 'Other settings' }, OTHER_GROUP);
  };
  for (const g of GROUPS) boxes.set(g.id, { g, box: groupBox(g, g.id) });
  for (const [name, r] of Object.entries(ranges)) {
    const g = groupOf(name);
    if (!boxes.has(g.id)) boxes.set(g.id, { g, box: groupBox(g, g.id) });
    const { box } = boxes.get(g.id);
    const desc = (r.description || name).replace(/^./, (c) => c.toUpperCase());
    const field = knobField(name, r, defaults[name], g.labels[name] || desc);
    const inMain = g.main.includes(name) || !GROUPS.includes(g);
    box.querySelector(inMain ? ':scope > .fields' : '.more .fields').append(field);
  }
  /* the namespace the uploaded-documents memory searches: not a knob, a session's field */
  const ub = boxes.get('unbounded').box;
  const ns = document.createElement('label');
  ns.className = 'field';
  ns.append(Object.assign(document.createElement('span'), { className: 'plain-label',
    textContent: 'Namespace to search (its name on the Namespaces tab; empty = default)' }));
  const nsIn = Object.assign(document.createElement('input'), { id: 'set-namespace', name: 'namespace',
    placeholder: 'default', spellcheck: false });
  ns.append(nsIn);
  ub.querySelector(':scope > .fields').prepend(ns);
  for (const { box } of boxes.values()) {
    if (!box.querySelector('.field')) continue;
    if (!box.querySelector('.more .field')) box.querySelector('.more').remove();
    form.append(box);
  }
  /* the dynamic-evaluation group says when this model cannot do it */
  const dyn = form.querySelector('[data-group="dyneval"] .when');
  if (dyn && state.model.dyneval && state.model.dyneval.statistics === false)
    dyn.textContent += ' This model has no such statistics yet, so the server refuses it for now.';
  summarizeSettings();
}

/* The form as a CacheSettings object (every field), and the namespace. */
function cacheSettings() {
  const cache = {};
  for (const el of $('#cache-form').querySelectorAll('.field.cache [name]')) {
    const t = el.dataset.type;
    if (t === 'boolean') cache[el.name] = el.checked;
    else if (t === 'enum') cache[el.name] = el.value;
    else cache[el.name] = el.value === '' ? undefined : Number(el.value);
  }
  return cache;
}
function namespace() { const e = $('#set-namespace'); return e ? e.value.trim() : ''; }

/* The summary beside the panel's title, and each group's on/off word. */
function summarizeSettings() {
  const c = cacheSettings();
  const on = [];
  for (const box of document.querySelectorAll('#cache-form fieldset.group')) {
    const g = GROUPS.find((x) => x.id === box.dataset.group);
    const st = box.querySelector('legend .state');
    if (!g) { st.textContent = ''; continue; }
    const isOn = g.on(c);
    st.textContent = isOn ? 'on' : 'off';
    st.className = 'state ' + (isOn ? 'on' : 'off');
    if (isOn) on.push(`${g.title.replace(/ \(.*\)$/, '').toLowerCase()} (${g.state(c)})`);
  }
  $('#settings-summary').textContent = on.length ? '· on: ' + on.join(', ') : '· all off: the model alone';
}

async function newSession(cache) {
  const body = { cache };
  const ns = namespace();
  if (ns) body.namespace = ns;
  return (await api('POST', '/v1/sessions', body)).id;
}
function dropSession(id) {
  if (id) api('DELETE', '/v1/sessions/' + encodeURIComponent(id)).catch(() => {});
}

/* ---- type-ahead ----------------------------------------------------------- */

function legend() {
  const box = $('#legend');
  box.textContent = '';
  for (const c of COMPONENTS) {
    const s = document.createElement('span');
    s.innerHTML = `<i class="c-${c}"></i>`;
    s.append(c);
    box.append(s);
  }
}

/* The text up to its last white space is fed to a session (only what was
 * added since the last feed: splitting across feeds gives the same numbers);
 * the word being typed filters the predictions. */
function splitTyped(text) {
  const m = text.match(/^([\s\S]*\s)?(\S*)$/);
  let complete = m[1] || '', partial = m[2] || '';
  /* an opening bracket or quote the model reads as a token of its own
   * (typed by a click without a space after it) is fed, not filtered on */
  let k = 0;
  while (k < partial.length && tokenKind(partial[k], complete + partial.slice(0, k)) === 'open') k++;
  if (k) { complete += partial.slice(0, k); partial = partial.slice(k); }
  return { complete, partial };
}

/* How a predicted token is typed, from the model's text conventions
 * (GET /v1/model's "text"; docs/normalisation.md): 'clitic' ('s, n't:
 * split off a word, so typed joined to it), 'close' (a punctuation mark or
 * a closing bracket or quote the model splits off: no space before it),
 * 'open' (an opening bracket or quote it splits off: no space after it), or
 * 'word' (a space before and after). A model without conventions splits on
 * white space only: every token is a word. */
function tokenKind(word, before) {
  const t = state.model && state.model.text;
  if (!t) return 'word';
  if (t.contractions && /^(['’ʼ]\p{L}+|n['’ʼ]t)$/iu.test(word)) return 'clitic';
  const split = (k) => t[k] === 'split';
  if (split('punctuation') && /^[.,;:!?…%]+$/.test(word)) return 'close';
  if (split('brackets') && /^[)\]}]$/.test(word)) return 'close';
  if (split('brackets') && /^[(\[{]$/.test(word)) return 'open';
  if (split('quotes') && /^[”’»]$/.test(word)) return 'close';
  if (split('quotes') && /^[“‘«]$/.test(word)) return 'open';
  if (split('quotes') && word === '"') return ((before || '').split('"').length % 2) ? 'open' : 'close';
  return 'word';
}

/* The text with a clicked prediction typed in place of the word being
 * typed, joined as the model writes it. */
function joinWord(text, word) {
  const { complete } = splitTyped(text);
  const trimmed = complete.replace(/[ \t]+$/, '');
  if (state.model && word === state.model.eos_token) {
    const eos = eosText();
    return (eos === '\n' ? complete : trimmed) + eos;
  }
  switch (tokenKind(word, trimmed)) {
    case 'clitic': case 'close': return trimmed + word + ' ';
    case 'open': return complete + word;
    default: return complete + word + ' ';
  }
}

function scheduleTypeahead() {
  clearTimeout(state.ta.timer);
  state.ta.timer = setTimeout(runTypeahead, 120);
}

async function runTypeahead() {
  const ta = state.ta;
  if (!state.model) return;
  /* the type-ahead is the Predict tab's: it runs when that tab is shown
   * (selectView), so its errors never cover another tab's */
  if ($('#view-predict').hidden) return;
  if (ta.busy) { ta.dirty = true; return; }
  ta.busy = true;
  $('#pred-list').dataset.busy = '1';
  try {
    do {
      ta.dirty = false;
      await updateTypeahead();
    } while (ta.dirty);
    showError(null);
  } catch (e) {
    showError(e);
  } finally {
    ta.busy = false;
    $('#pred-list').dataset.busy = '0';
  }
}

async function updateTypeahead() {
  const ta = state.ta;
  const { complete, partial } = splitTyped($('#ta-text').value);
  const key = JSON.stringify([cacheSettings(), namespace()]);
  if (!ta.sid || key !== ta.key || !complete.startsWith(ta.fed)) {
    dropSession(ta.sid);
    ta.sid = null;
    ta.sid = await newSession(cacheSettings());
    ta.key = key;
    ta.fed = '';
    ta.unk = [];
  }
  const delta = complete.slice(ta.fed.length);
  if (delta) {
    /* scores: the answer lists the tokens, each with its unk flag */
    const f = await api('POST', `/v1/sessions/${ta.sid}/feed`, { text: delta, scores: true });
    (f.tokens || []).forEach((w, i) => { if (f.unk && f.unk[i]) ta.unk.push(w); });
    ta.fed = complete;
  }
  showUnknown(ta.unk);
  const maxK = state.model.limits.max_top_k;
  const top = partial ? Math.min(maxK, 1000) : Math.min(maxK, 10);
  const r = await api('POST', `/v1/sessions/${ta.sid}/predict`, { top_k: top, components: true, explain: true });
  /* the partial word as the model writes words: no leading quote or bracket, lower case */
  const low = partial.replace(/^[^\p{L}\p{N}']+/u, '').toLowerCase();
  const preds = r.predictions.filter((p) => p.word.toLowerCase().startsWith(low)).slice(0, 10);
  ta.preds = preds;
  renderPredictions(preds, r.position, partial);
  $('#pred-list').dataset.text = complete + partial;
}

/* The words typed so far that the model does not know (each read as its
 * unk token): a perplexity or a prediction after them means less. */
function showUnknown(words) {
  const el = $('#ta-unk');
  el.hidden = !words.length;
  el.dataset.count = words.length;
  el.textContent = '';
  if (!words.length) return;
  el.append(`${words.length} word${words.length > 1 ? 's' : ''} the model does not know, ` +
            `each read as "an unknown word": `);
  words.slice(-12).forEach((w, i) => {
    if (i) el.append(', ');
    el.append(Object.assign(document.createElement('b'), { textContent: w }));
  });
}

/* What the page types for the model's eos token: a sentence end under
 * sentence conventions (a newline is only a space there; a feed that
 * starts with it ends the sentence fed before), else a newline. */
function eosText() {
  const t = state.model && state.model.text;
  return t && t.lines === 'sentences' ? '. ' : '\n';
}

function renderPredictions(preds, position, partial) {
  const list = $('#pred-list');
  list.textContent = '';
  list.dataset.session = state.ta.sid;
  list.dataset.position = position;
  list.dataset.prefix = partial;
  const maxp = preds.reduce((m, p) => Math.max(m, p.prob), 0) || 1;
  preds.forEach((p, i) => {
    const li = document.createElement('li');
    const unk = p.word === state.model.unk_token;
    li.className = 'pred' + (unk ? ' unk' : '');
    if (unk) li.title = UNK_NOTE;
    li.dataset.word = p.word;
    li.dataset.prob = p.prob;
    li.tabIndex = 0;
    const w = document.createElement('button');
    w.className = 'word';
    w.type = 'button';
    w.textContent = shownWord(p.word);
    if (unk) w.setAttribute('aria-disabled', 'true');
    const track = document.createElement('div');
    track.className = 'track';
    const bar = document.createElement('div');
    bar.className = 'bar';
    bar.style.width = (100 * p.prob / maxp) + '%';
    for (const c of COMPONENTS) {
      const share = p.components ? p.components[c] || 0 : (c === 'model' ? p.prob : 0);
      if (!(share > 0)) continue;
      const seg = document.createElement('span');
      seg.className = 'seg-' + c;
      seg.dataset.comp = c;
      seg.dataset.share = share;
      seg.style.width = (100 * share / p.prob) + '%';
      seg.title = `${c}: ${(100 * share).toFixed(2)}%`;
      bar.append(seg);
    }
    track.append(bar);
    const pct = document.createElement('span');
    pct.className = 'pct';
    pct.textContent = (100 * p.prob).toFixed(p.prob < 0.001 ? 3 : 1) + '%';
    const info = document.createElement('button');
    info.className = 'info';
    info.type = 'button';
    info.textContent = 'i';
    info.title = 'where this prediction comes from';
    li.append(w, track, pct, info);
    li.addEventListener('mouseenter', () => showExplain(i));
    li.addEventListener('focus', () => showExplain(i));
    info.addEventListener('click', (ev) => { ev.stopPropagation(); showExplain(i); });
    li.addEventListener('click', () => appendWord(p.word));
    li.addEventListener('keydown', (ev) => { if (ev.key === 'Enter') appendWord(p.word); });
    list.append(li);
  });
  if (!preds.length) {
    const li = document.createElement('li');
    li.className = 'muted';
    li.textContent = partial ? `no prediction starts with "${partial}"` : 'no prediction';
    list.append(li);
  }
  followExplain();
}

/* The unknown-word token as the page shows it: never as a word to type. */
const UNK_NOTE = 'The model expects a word outside its vocabulary here, and cannot say which: type it yourself.';
function shownWord(word) { return state.model && word === state.model.unk_token ? 'an unknown word' : word; }

/* The explanation panel follows the text: once the predictions change, it
 * explains the prediction under the pointer, else the word it explained
 * before (with its new probability), else the first one. */
const pointer = { x: null, y: null };
function followExplain() {
  const box = $('#explain');
  const preds = state.ta.preds;
  if (box.dataset.word === undefined) return;     /* nothing explained yet: the hint stays */
  let i = -1;
  if (pointer.x !== null) {
    const li = document.elementFromPoint(pointer.x, pointer.y);
    const row = li && li.closest('#pred-list .pred');
    if (row) i = [...row.parentNode.children].indexOf(row);
  }
  if (i < 0) i = preds.findIndex((p) => p.word === box.dataset.word);
  if (i < 0 && preds.length) i = 0;
  if (i >= 0) showExplain(i);
  else {
    box.textContent = '';
    delete box.dataset.word;
    box.append(Object.assign(document.createElement('p'), { className: 'muted', textContent: 'No prediction to explain.' }));
  }
}

function appendWord(word) {
  /* the unknown-word token is not a word anyone can type */
  if (state.model && word === state.model.unk_token) return;
  const box = $('#ta-text');
  box.value = joinWord(box.value, word);
  box.focus();
  scheduleTypeahead();
}

/* A snippet "a b [word] c" with the bracketed word marked (text nodes only). */
function snippetNode(snippet) {
  const span = document.createElement('span');
  span.className = 'snippet';
  const m = snippet.match(/^([\s\S]*?)\[([^\]]*)\]([\s\S]*)$/);
  if (!m) { span.textContent = snippet; return span; }
  const mark = document.createElement('mark');
  mark.textContent = m[2];
  span.append(m[1], mark, m[3]);
  return span;
}

function showExplain(i) {
  const p = state.ta.preds[i];
  const box = $('#explain');
  document.querySelectorAll('.pred.active').forEach((n) => n.classList.remove('active'));
  const li = $('#pred-list').children[i];
  if (li) li.classList.add('active');
  box.textContent = '';
  box.dataset.word = p.word;
  box.dataset.position = $('#pred-list').dataset.position;
  const h = document.createElement('h4');
  h.textContent = p.word === state.model.unk_token ? `an unknown word: ${(100 * p.prob).toFixed(2)}%`
    : `"${p.word}": ${(100 * p.prob).toFixed(2)}%`;
  box.append(h);
  if (p.word === state.model.unk_token)
    box.append(Object.assign(document.createElement('p'), { textContent: UNK_NOTE }));
  if (p.components) {
    const parts = COMPONENTS.filter((c) => p.components[c] > 0)
      .map((c) => `${c} ${(100 * p.components[c] / p.prob).toFixed(1)}%`);
    box.append(Object.assign(document.createElement('p'), { className: 'muted', textContent: 'shares: ' + parts.join(', ') }));
  }
  const ex = p.explain || [];
  if (!ex.length) {
    box.append(Object.assign(document.createElement('p'), { className: 'muted',
      textContent: 'No cache entry behind it: the model\'s own prediction (turn on the unbounded cache of a namespace with documents to see sources).' }));
    return;
  }
  const ul = document.createElement('ul');
  for (const e of ex) {
    const li = document.createElement('li');
    li.className = 'src-' + e.source;
    if (e.source === 'unbounded') {
      li.dataset.document = e.document;
      li.dataset.offset = e.offset;
      const head = document.createElement('div');
      head.innerHTML = '<b></b> · offset <span class="off"></span> · weight <span class="wt"></span> · distance <span class="dist"></span>';
      head.querySelector('b').textContent = 'document ' + e.document;
      head.querySelector('.off').textContent = e.offset;
      head.querySelector('.wt').textContent = (100 * e.weight).toFixed(1) + '%';
      head.querySelector('.dist').textContent = Number(e.distance).toFixed(3);
      li.append(head);
      if (e.snippet) li.append(snippetNode(e.snippet));
    } else {
      li.textContent = `${e.source} cache: this session's position ${e.position}, weight ${(100 * e.weight).toFixed(1)}%`;
    }
    ul.append(li);
  }
  box.append(ul);
}

/* ---- surprisal map -------------------------------------------------------- */

/* Pieces of at most MAP_CHUNK characters, each ending in white space (a word
 * is never cut), so feeding them in turn equals feeding the whole text. */
function chunks(text) {
  const out = [];
  let i = 0;
  while (i < text.length) {
    let end = Math.min(text.length, i + MAP_CHUNK);
    if (end < text.length) {
      let j = end;
      while (j > i && !/\s/.test(text[j - 1])) j--;
      if (j > i) end = j;
      else { while (end < text.length && !/\s/.test(text[end])) end++; }
    }
    out.push(text.slice(i, end));
    i = end;
  }
  return out;
}

/* surprisal in bits to a colour: pale yellow (0) to dark red (16 and more) */
function heat(bits) {
  if (bits == null) return '#eee';
  const t = Math.min(1, Math.max(0, bits / 16));
  return `hsl(${55 - 55 * t}, ${90 - 10 * t}%, ${94 - 49 * t}%)`;
}
const LN2 = Math.log(2);
function bitsOf(lp) { return lp == null ? null : (lp <= -1e29 ? Infinity : -lp / LN2); }
function fmtBits(b) { return b == null ? '–' : (b === Infinity ? '∞' : b.toFixed(2)); }

const mapState = { tokens: [], running: false };

/* The map compares the static model with the memories: while none is on
 * in the settings (no cache, no learning from the text), its right column
 * uses a small neural cache (the server's theta and lambda) rather than
 * repeat the left one, and says so. */
const MAP_NEURAL_SIZE = 500;
function mapCache(settings) {
  if (settings.neural_size > 0 || settings.unigram_size > 0 || settings.unbounded || settings.dyn_lr > 0)
    return { cache: settings, note: '' };
  return { cache: Object.assign({}, settings, { neural_size: MAP_NEURAL_SIZE }),
           note: `No cache is on in the settings, so this column uses a neural cache of the last ${MAP_NEURAL_SIZE} ` +
                 'words (the Recent contexts memory).' };
}

async function runMap() {
  if (mapState.running || !state.model) return;
  const text = $('#map-text').value;
  if (!text.trim()) { showError(new Error('nothing to score: paste a text or choose a file')); return; }
  const { cache: cached, note } = mapCache(cacheSettings());
  $('#map-cache-note').textContent = note;
  delete $('#map-status').dataset.done;
  /* the static side: the model alone, every memory of the settings off
   * (dynamic evaluation, new words and the gate too) */
  const plain = Object.assign({}, cached, { unigram_size: 0, neural_size: 0, unbounded: false,
                                            global_norm: false, neural_f16: false, dyn_lr: 0, gate: false,
                                            open_vocab: false, uniform_mu: 0, vocab_size_full: 0 });
  const parts = chunks(text);
  const prog = $('#map-progress');
  const bodies = { static: $('#map-static'), cached: $('#map-cached') };
  bodies.static.textContent = '';
  bodies.cached.textContent = '';
  $('#ppl-static').textContent = '–';
  $('#ppl-cached').textContent = '–';
  prog.max = parts.length;
  prog.value = 0;
  $('#map-run').disabled = true;
  $('#map-status').dataset.done = '0';
  mapState.running = true;
  mapState.tokens = [];
  const sums = { static: [0, 0], cached: [0, 0] };
  let sids = [], unk = 0;
  showError(null);
  try {
    sids = [await newSession(plain), await newSession(cached)];
    for (let k = 0; k < parts.length; k++) {
      $('#map-status').textContent = `chunk ${k + 1} of ${parts.length}`;
      /* the cached side also splits each token's probability by component */
      const [a, b] = await Promise.all(sids.map((sid, j) =>
        api('POST', `/v1/sessions/${sid}/feed`, { text: parts[k], scores: true, components: j === 1 })));
      /* offsets and lengths count the chunk's characters (code points,
       * docs/api.md): each token shows the characters it was read from, the
       * text between tokens stays as typed */
      const chars = Array.from(parts[k]);
      let end = 0;
      for (let i = 0; i < a.tokens.length; i++) {
        const off = a.offsets[i], len = a.lengths[i];
        const t = { word: a.tokens[i], static: bitsOf(a.logprobs[i]), cached: bitsOf(b.logprobs[i]),
                    comps: b.components ? b.components[i] : null, unk: !!(a.unk && a.unk[i]),
                    src: chars.slice(off, off + len).join('') };
        const gap = off > end ? chars.slice(end, off).join('') : '';
        end = Math.max(end, off + len);
        const n = mapState.tokens.length;
        mapState.tokens.push(t);
        if (t.unk) unk++;
        for (const side of ['static', 'cached']) {
          if (gap.trim()) bodies[side].append(gap.trim() + ' ');
          bodies[side].append(tokenSpan(t, n, side));
          if (t[side] != null) { sums[side][0] += t[side]; sums[side][1]++; }
        }
      }
      prog.value = k + 1;
      for (const side of ['static', 'cached']) {
        const [s, n] = sums[side];
        /* perplexity = 2^(mean surprisal in bits) = exp(-mean log p) */
        const ppl = n ? Math.pow(2, s / n) : NaN;
        const el = $('#ppl-' + side);
        el.textContent = isFinite(ppl) ? ppl.toFixed(2) : '∞';
        el.dataset.ppl = ppl;
        el.dataset.count = n;
      }
    }
    const nt = mapState.tokens.length;
    $('#map-status').textContent = `${nt} tokens in ${parts.length} chunk${parts.length > 1 ? 's' : ''}, ` +
      `${unk} unknown word${unk === 1 ? '' : 's'} (${nt ? (100 * unk / nt).toFixed(1) : 0}%, underlined)`;
    $('#map-status').dataset.chunks = parts.length;
    $('#map-status').dataset.unk = unk;
    $('#map-status').dataset.done = '1';
  } catch (e) {
    $('#map-status').textContent = 'stopped';
    showError(e);
  } finally {
    sids.forEach(dropSession);
    $('#map-run').disabled = false;
    mapState.running = false;
  }
}

function tokenSpan(t, n, side) {
  const frag = document.createDocumentFragment();
  const s = document.createElement('span');
  const eos = state.model && t.word === state.model.eos_token;
  /* an eos read from a newline (or the end) is drawn as one; from a
   * sentence end, as the characters that ended it */
  const nl = eos && !(t.src || '').trim();
  s.className = 'tok' + (eos ? ' eos' : '') + (t.unk ? ' unk' : '');
  s.dataset.i = n;
  s.dataset.bits = t[side] == null ? '' : t[side];
  s.textContent = nl ? '↵' : (t.src || t.word);
  if (t.unk) s.title = 'a word the model does not know: scored as "an unknown word"';
  s.style.background = heat(t[side]);
  frag.append(s, ' ');   /* a break opportunity between words */
  if (nl || (eos && /\n/.test(t.src || ''))) frag.append(document.createElement('br'));
  return frag;
}

function showTip(ev) {
  const s = ev.target.closest('.tok');
  const tip = $('#map-tip');
  document.querySelectorAll('.tok.hl').forEach((n) => n.classList.remove('hl'));
  if (!s) { tip.hidden = true; return; }
  const t = mapState.tokens[Number(s.dataset.i)];
  document.querySelectorAll(`.tok[data-i="${s.dataset.i}"]`).forEach((n) => n.classList.add('hl'));
  tip.textContent = '';
  const b = document.createElement('b');
  b.textContent = t.unk ? `"${(t.src || '').trim() || t.word}": a word the model does not know, scored as "an unknown word"`
    : t.word + (t.src && t.src !== t.word && t.src.trim() ? ` (from "${t.src}")` : '');
  const tab = document.createElement('table');
  const rows = [['static model', t.static], ['with caches', t.cached]];
  for (const [name, bits] of rows) {
    const tr = tab.insertRow();
    tr.insertCell().textContent = name;
    tr.insertCell().textContent = fmtBits(bits) + ' bits';
    tr.insertCell().textContent = bits == null ? '' : 'p = ' + Math.pow(2, -bits).toPrecision(3);
  }
  tip.append(b, tab);
  if (t.static != null && t.cached != null && isFinite(t.static) && isFinite(t.cached)) {
    const d = t.static - t.cached;
    tip.append(Object.assign(document.createElement('div'),
      { textContent: d >= 0 ? `caches save ${d.toFixed(2)} bits` : `caches cost ${(-d).toFixed(2)} bits` }));
  }
  if (t.comps) {
    const p = COMPONENTS.reduce((a, c) => a + (t.comps[c] || 0), 0);
    const bar = document.createElement('div');
    bar.className = 'bar';
    const lines = [];
    for (const c of COMPONENTS) {
      const v = t.comps[c] || 0;
      if (!(v > 0) || !(p > 0)) continue;
      const seg = document.createElement('span');
      seg.className = 'seg-' + c;
      seg.style.width = (100 * v / p) + '%';
      bar.append(seg);
      lines.push(`${c} ${(100 * v / p).toFixed(1)}%`);
    }
    tip.append(bar, Object.assign(document.createElement('div'), { textContent: lines.join(' · ') }));
  }
  tip.hidden = false;
  const r = s.getBoundingClientRect();
  const w = tip.offsetWidth;
  tip.style.left = Math.max(4, Math.min(window.innerWidth - w - 4, r.left)) + 'px';
  tip.style.top = (r.bottom + 6 + tip.offsetHeight > window.innerHeight ? r.top - tip.offsetHeight - 6 : r.bottom + 6) + 'px';
}

/* ---- namespaces ----------------------------------------------------------- */

function mib(bytes) { return (bytes / 1048576).toFixed(1) + ' MiB'; }

async function loadNamespaces() {
  let r;
  try {
    r = await api('GET', '/v1/namespaces');
  } catch (e) {
    showError(e);
    $('#ns-status').textContent = 'could not list namespaces';
    return;
  }
  const tb = $('#ns-table tbody');
  tb.textContent = '';
  for (const ns of r.namespaces) {
    const tr = tb.insertRow();
    tr.dataset.name = ns.name;
    tr.dataset.documents = ns.documents;
    tr.dataset.entries = ns.entries;
    /* words stored: one entry a word of each document (the API's entries);
     * new words: the API's words, those outside the model's vocabulary */
    const cells = [ns.name, ns.entries.toLocaleString('en'), ns.documents.toLocaleString('en'),
                   ns.words.toLocaleString('en'), mib(ns.memory_bytes), ns.index ? ns.index.type : '',
                   (ns.uploads || []).length ? `${ns.uploads.length}` : ''];
    cells.forEach((v, i) => {
      const td = tr.insertCell();
      td.textContent = v;
      if (i > 0 && i < 5) td.className = 'num';
    });
    const del = document.createElement('button');
    del.className = 'danger';
    del.textContent = 'Delete';
    del.addEventListener('click', () => deleteNamespace(ns.name, ns.entries));
    tr.insertCell().append(del);
  }
  $('#ns-status').textContent = `${r.namespaces.length} namespace${r.namespaces.length === 1 ? '' : 's'}`;
  showError(null);
}

async function deleteNamespace(name, entries) {
  if (!confirm(`Delete namespace "${name}" (${entries} entries) and its data on disk? This cannot be undone.`)) return;
  try {
    await api('DELETE', `/v1/namespaces/${encodeURIComponent(name)}?confirm=${encodeURIComponent(name)}`);
    $('#ns-status').textContent = `deleted ${name}`;
  } catch (e) {
    showError(e);
  }
  await loadNamespaces();
}

/* Streams the file into the namespace; while it runs, the namespace's
 * "uploads" field (bytes received, tokens added) drives the progress bar. */
async function upload(ev) {
  ev.preventDefault();
  const ns = $('#up-ns').value.trim();
  const file = $('#up-file').files[0];
  const id = $('#up-id').value.trim();
  if (!ns || !file) return;
  const bar = $('#up-progress');
  const status = $('#up-status');
  bar.max = file.size || 1;
  bar.value = 0;
  status.textContent = `uploading ${file.name} (${file.size.toLocaleString('en')} bytes)…`;
  status.dataset.done = '';
  const path = `/v1/namespaces/${encodeURIComponent(ns)}/documents` + (id ? `?id=${encodeURIComponent(id)}` : '');
  let finished = false;
  const poll = async () => {
    while (!finished) {
      try {
        const info = await api('GET', `/v1/namespaces/${encodeURIComponent(ns)}`);
        const up = (info.uploads || []).find((u) => !id || u.document === id);
        if (up && !finished) {
          bar.value = up.bytes_received;
          status.textContent = `${up.bytes_received.toLocaleString('en')} of ${file.size.toLocaleString('en')} bytes, ` +
            `${up.tokens_added.toLocaleString('en')} tokens added (${Math.round(up.tokens_per_second || 0).toLocaleString('en')} tokens/s)`;
        }
      } catch (e) { /* the namespace appears with the first batch */ }
      await new Promise((res) => setTimeout(res, 250));
    }
  };
  const poller = poll();
  try {
    const r = await api('POST', path, undefined, { raw: file, type: 'text/plain' });
    bar.value = bar.max;
    status.textContent = `added ${r.tokens_added.toLocaleString('en')} tokens as ${r.ids.join(', ')}; ` +
      `${r.namespace} now holds ${r.entries.toLocaleString('en')} entries`;
    status.dataset.done = '1';
    showError(null);
  } catch (e) {
    status.textContent = 'upload failed';
    showError(e);
  } finally {
    finished = true;
    await poller;
  }
  await loadNamespaces();
}

/* ---- wiring --------------------------------------------------------------- */

function selectView(name) {
  for (const b of document.querySelectorAll('#tabs button'))
    b.setAttribute('aria-selected', String(b.dataset.view === name));
  for (const v of document.querySelectorAll('.view')) v.hidden = v.id !== 'view-' + name;
  $('#settings').hidden = name === 'ns';     /* the settings are the sessions' */
  if (name === 'ns') loadNamespaces();
  if (name === 'predict') scheduleTypeahead();
  history.replaceState(null, '', '#' + name);
}

async function start() {
  legend();
  const key = $('#api-key');
  key.value = localStorage.getItem('neurocache.key') || '';
  key.addEventListener('change', async () => {
    localStorage.setItem('neurocache.key', key.value.trim());
    /* a session belongs to the key that made it: the next feed makes one */
    state.ta.sid = null;
    if (await loadModel()) scheduleTypeahead();
  });
  for (const b of document.querySelectorAll('#tabs button'))
    b.addEventListener('click', () => selectView(b.dataset.view));
  $('#ta-text').addEventListener('input', scheduleTypeahead);
  $('#pred-list').addEventListener('mousemove', (ev) => { pointer.x = ev.clientX; pointer.y = ev.clientY; });
  $('#pred-list').addEventListener('mouseleave', () => { pointer.x = pointer.y = null; });
  $('#cache-form').addEventListener('change', () => { summarizeSettings(); scheduleTypeahead(); });
  $('#cache-form').addEventListener('submit', (ev) => ev.preventDefault());
  $('#map-run').addEventListener('click', runMap);
  $('#map-file').addEventListener('change', async (ev) => {
    const f = ev.target.files[0];
    if (f) $('#map-text').value = await f.text();
  });
  for (const id of ['#map-static', '#map-cached']) {
    $(id).addEventListener('mouseover', showTip);
    $(id).addEventListener('click', showTip);
    $(id).addEventListener('mouseleave', () => { $('#map-tip').hidden = true; });
  }
  $('#ns-refresh').addEventListener('click', loadNamespaces);
  $('#ns-upload').addEventListener('submit', upload);
  /* the settings stay folded until asked for (issue 37) */
  const view = location.hash.slice(1);
  selectView(['predict', 'map', 'ns'].includes(view) ? view : 'predict');
  window.addEventListener('pagehide', () => dropSession(state.ta.sid));
  if (await loadModel()) scheduleTypeahead();
  document.body.dataset.ready = '1';
}

start();
