// check.mjs -- deploy/k8s/*.yaml against the Kubernetes API's schemas: each
// document parsed (yaml), then validated by kubernetes-models' validator of
// its apiVersion and kind (generated from the Kubernetes OpenAPI document:
// types, required fields, enums, formats). Those validators accept fields
// the schema does not name, so a second, strict pass (kubeconform's -strict)
// types each document as kubernetes-models' declaration of its kind and lets
// TypeScript's excess-property check name any unknown field, at any depth.
// Each pass is first shown to fail: copies of the StatefulSet with a string
// port, without its selector, and with a misspelt field must be refused.
// Prints "N passed, N failed".
// NC_NODE_MODULES: where scripts/deps.sh installed tests/k8s (build/node-k8s).
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const modules = path.resolve(process.env.NC_NODE_MODULES || 'build/node-k8s/node_modules');
const dir = process.argv[2] || 'deploy/k8s';
const { parseAllDocuments } = await import(pathToFileURL(path.join(modules, 'yaml/dist/index.js')));
let passed = 0, failed = 0;
const ok = (msg) => { passed++; console.log(`ok   ${msg}`); };
const bad = (msg) => { failed++; console.log(`FAIL ${msg}`); };

// apiVersion "apps/v1" + kind StatefulSet -> kubernetes-models/apps/v1/StatefulSet.js
async function validator(apiVersion, kind) {
    const file = path.join(modules, 'kubernetes-models', ...apiVersion.split('/'), `${kind}.js`);
    if (!fs.existsSync(file)) return null;
    const mod = await import(pathToFileURL(file));
    return mod[kind];
}
async function check(doc) {
    const Model = await validator(String(doc.apiVersion), String(doc.kind));
    if (!Model) return `no schema for ${doc.apiVersion} ${doc.kind}`;
    try { new Model(doc).validate(); return null; } catch (e) { return e.message; }
}

const docs = [];
for (const f of fs.readdirSync(dir).filter((n) => /\.ya?ml$/.test(n)).sort()) {
    for (const d of parseAllDocuments(fs.readFileSync(path.join(dir, f), 'utf8'))) {
        if (d.errors.length) { bad(`${f}: YAML: ${d.errors[0].message}`); continue; }
        const obj = d.toJS();
        if (obj) docs.push([f, obj]);
    }
}

// the checker refuses what it must
const sts = docs.find(([, o]) => o.kind === 'StatefulSet');
if (sts) {
    const portStr = structuredClone(sts[1]);
    portStr.spec.template.spec.containers[0].ports = [{ containerPort: '8080' }];
    const noSel = structuredClone(sts[1]);
    delete noSel.spec.selector;
    for (const [what, o] of [['a string containerPort', portStr], ['no selector', noSel]])
        (await check(o)) ? ok(`a StatefulSet with ${what} is refused`) : bad(`a StatefulSet with ${what} passed`);
} else bad(`${dir}: no StatefulSet`);

for (const [f, o] of docs) {
    const err = await check(o);
    const name = `${f}: ${o.apiVersion} ${o.kind} ${o.metadata?.name ?? '?'}`;
    err ? bad(`${name}: ${err}`) : ok(`${name} matches the schema`);
}
// ---- strict: TypeScript's excess-property check against the declarations ----
// One line per document, `export const dN: I<Kind> = <its JSON>;`, in a file
// beside node_modules so that `kubernetes-models/...` resolves; an error on
// line N names document N.
const tsc = path.join(modules, 'typescript', 'bin', 'tsc');
if (!fs.existsSync(tsc)) {
    bad(`${tsc} missing: run make deps-test`);
} else {
    const strict = [...docs];
    let typo = -1;
    if (sts) {
        const t = structuredClone(sts[1]);
        t.spec.template.spec.containers[0].readinessprobe = t.spec.template.spec.containers[0].readinessProbe;
        typo = strict.length;
        strict.push(['(a StatefulSet with "readinessprobe")', t]);
    }
    const lines = strict.map(([, o], i) => {
        const [v, k] = [String(o.apiVersion), String(o.kind)];
        return `import type { I${k} as T${i} } from "kubernetes-models/${v}/${k}"; ` +
            `export const d${i}: T${i} = ${JSON.stringify(o)};`;
    });
    const tdir = path.join(modules, '..', 'strict');
    fs.mkdirSync(tdir, { recursive: true });
    fs.writeFileSync(path.join(tdir, 'manifests.ts'), lines.join('\n') + '\n');
    const r = spawnSync(process.execPath, [tsc, '--noEmit', '--strict', '--skipLibCheck', '--module', 'nodenext',
        '--moduleResolution', 'nodenext', 'manifests.ts'], { cwd: tdir, encoding: 'utf8' });
    const errs = {};
    for (const m of (r.stdout + r.stderr).matchAll(/manifests\.ts\((\d+),\d+\): error (TS\d+: .*)/g))
        (errs[Number(m[1]) - 1] ??= []).push(m[2]);
    strict.forEach(([f, o], i) => {
        const name = `${f}: ${o.kind} ${o.metadata?.name ?? '?'}`;
        if (i === typo) errs[i] ? ok(`strict: a misspelt field is named: ${errs[i][0].slice(0, 100)}`)
                                : bad('strict: a misspelt field passed');
        else errs[i] ? bad(`strict: ${name}: ${errs[i].join('; ')}`) : ok(`strict: ${name}: no field the types do not know`);
    });
    if (r.status !== 0 && Object.keys(errs).length === 0) bad(`tsc failed: ${(r.stdout + r.stderr).slice(0, 300)}`);
}

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
