// check.mjs -- deploy/k8s/*.yaml against the Kubernetes API's schemas: each
// document parsed (yaml), then validated by kubernetes-models' validator of
// its apiVersion and kind (generated from the Kubernetes OpenAPI document:
// types, required fields, enums, formats). Like kubeconform without
// -strict, fields the schema does not name are not reported. First the
// checker is shown to fail: copies of the StatefulSet with a string port and
// without its selector must be refused. Prints "N passed, N failed".
// NC_NODE_MODULES: where scripts/deps.sh installed tests/k8s (build/node-k8s).
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
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
