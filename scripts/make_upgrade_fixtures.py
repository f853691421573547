#!/usr/bin/env python3
"""make_upgrade_fixtures.py -- writes tests/fixtures/upgrade-<commit>/: on-disk
data of every format as the build in bin/ writes it, and the predictions that
build answered from it (issue 38; docs/operations.md#compatibility).

    python3 scripts/make_upgrade_fixtures.py [--bin bin] [--out DIR] [--name NAME]

What it makes (a few hundred pairs; every step deterministic but FAISS's
k-means and the daemon's timing, so a rerun gives other bytes but the same
kinds of file -- the committed directory is the reference, not a rerun):

  model/        the lstm-2layer fixture with an IVF16,PQ4np unbounded.faiss
                (build-index), a gate (fit-gate: gate.json, gate.safetensors)
                and dynamic evaluation's statistics (dyn-stats: dyneval/)
  data/         a data directory: namespaces "keys" (float16 keys) and
                "compact" (PQ codes), each with a snapshot (taken at a
                SIGTERM), log records after it, and the daemon killed -9;
                the keys log ends in a torn record (a crash mid-append)
  blobs/        session blobs: plain-v1..v4 (one session, each format
                version; v4 exported by the daemon, v1-v3 re-encoded from it
                as those versions lay out -- core/session/stream.c: the settings
                unnamed in a fixed order, v1-v2 without the dynamic
                evaluation byte), dyn-v3/v4 (a session with the gate and
                dynamic evaluation on, carrying its adapted weights)
  expected.json the namespaces' counts and every probe: how it was asked and
                the predictions (top 20, probabilities as the daemon printed)
"""
import argparse
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def text_of(n, seed):
    """n fixture words w0..w47 in a seeded walk with repeats"""
    r = random.Random(seed)
    w, out = 0, []
    for _ in range(n):
        w = (w + 1) % 48 if r.random() < 0.5 else r.randrange(48)
        out.append("w%d" % w)
    return " ".join(out) + "\n"


# the daemon's settings the fixture was written with (and is read back with:
# the keys namespace moves to the IVF index at 200 pairs, so both its
# snapshot and its replayed log hold an IVF index)
DAEMON_ARGS = ["--fsync", "group", "--snapshot-period", "0", "--index-switch-at", "200"]


def doc_text(n, seed):
    """text_of with a few words outside the vocabulary (the namespace's own)"""
    words = text_of(n, seed).split()
    for i in range(7, n, 23):
        words[i] = "oov%d" % (i % 3)
    return " ".join(words) + "\n"


class Daemon:
    def __init__(self, binp, model, data, log):
        self.portfile = tempfile.mktemp(prefix="nc_fix_port_")
        self.logf = open(log, "ab")
        self.p = subprocess.Popen([os.path.join(binp, "neurocached"), "--model", model, "--data-dir", data,
                                   "--port", "0", "--port-file", self.portfile, "--bind", "127.0.0.1",
                                   "--threads", "2", "--allow-root"] + DAEMON_ARGS,
                                  stdout=self.logf, stderr=self.logf)
        for _ in range(600):
            if os.path.exists(self.portfile) and open(self.portfile).read().strip():
                self.port = int(open(self.portfile).read().strip())
                try:
                    if self.call("GET", "/ready")[0] == 200:
                        return
                except OSError:
                    pass
            if self.p.poll() is not None:
                sys.exit("daemon exited; see %s" % log)
            time.sleep(0.1)
        sys.exit("daemon not ready")

    def call(self, method, path, body=None, ctype="application/json"):
        data = body if isinstance(body, (bytes, type(None))) else (
            body.encode() if isinstance(body, str) else json.dumps(body).encode())
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path), data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", ctype)
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def ok(self, method, path, body=None, ctype="application/json"):
        st, b = self.call(method, path, body, ctype)
        if st not in (200, 201, 204):
            sys.exit("%s %s: %d %s" % (method, path, st, b[:300]))
        return b

    def stop(self, sig):
        self.p.send_signal(sig)
        self.p.wait(120)
        os.unlink(self.portfile)


# the probes: a session reading a namespace, or importing a blob, then a
# feed and a predict (top 20); answered by the writing build, recorded
NS_CACHE = {"unbounded": True, "unbounded_lambda": 0.5, "knn": 32, "nprobe": 4}
PLAIN = {"neural_size": 25, "neural_theta": 1.5, "neural_lambda": 0.2, "unigram_size": 30,
         "unigram_lambda": 0.15, "open_vocab": True, "uniform_mu": 0.002}
DYN = dict(PLAIN, gate=True, dyn_lr=0.01, dyn_segment=5, dyn_params=1)
PROBE_TEXT = "w3 w4 oov1 w5 w6 w7 w9 w3 w4"


def ns_probe(d, ns, sid):
    d.ok("POST", "/v1/sessions", {"id": sid, "namespace": ns, "cache": NS_CACHE})
    d.ok("POST", "/v1/sessions/%s/feed" % sid, {"text": PROBE_TEXT})
    pred = json.loads(d.ok("POST", "/v1/sessions/%s/predict" % sid, {"top_k": 20}))["predictions"]
    d.ok("DELETE", "/v1/sessions/%s" % sid)
    return {"kind": "namespace", "namespace": ns, "cache": NS_CACHE, "text": PROBE_TEXT, "predictions": pred}


def blob_probe(d, blob, name, sid):
    d.ok("POST", "/v1/sessions", {"id": sid})
    d.ok("PUT", "/v1/sessions/%s/state" % sid, blob, "application/octet-stream")
    d.ok("POST", "/v1/sessions/%s/feed" % sid, {"text": PROBE_TEXT})
    pred = json.loads(d.ok("POST", "/v1/sessions/%s/predict" % sid, {"top_k": 20}))["predictions"]
    d.ok("DELETE", "/v1/sessions/%s" % sid)
    return {"kind": "blob", "blob": name, "text": PROBE_TEXT, "predictions": pred}


OLD_KNOBS = ["unigram_size", "unigram_lambda", "neural_size", "neural_theta", "neural_lambda", "global_norm",
             "neural_alpha", "neural_f16", "unbounded", "knn", "nprobe", "unbounded_lambda", "kernel", "exact",
             "open_vocab", "uniform_mu", "vocab_size_full", "gate", "gate_skip", "dyn_lr", "dyn_decay",
             "dyn_segment", "dyn_params"]
OLD_COUNT = {1: 17, 2: 19, 3: 23}


def reencode(env, version):
    """The session state env (server/domain/migrate.c's envelope "NCSESS\\r\\n" around
    an NCSTRM04 stream blob) with its stream blob as version 1-3 lays it out"""
    assert env[:8] == b"NCSESS\r\n" and zlib.crc32(env[:-4]) == struct.unpack("<I", env[-4:])[0]
    o = 8 + 4 + 8 + 12
    o += 2 + struct.unpack_from("<H", env, o)[0]
    o += 2 + struct.unpack_from("<H", env, o)[0]
    o += 8
    sl = struct.unpack_from("<Q", env, o)[0]
    inner = reencode_stream(env[o + 8:o + 8 + sl], version)
    out = env[:o] + struct.pack("<Q", len(inner)) + inner
    return out + struct.pack("<I", zlib.crc32(out))


def reencode_stream(v4, version):
    """The NCSTRM04 blob v4 as version 1-3 lays it out (core/session/stream.c)"""
    assert v4[:8] == b"NCSTRM04" and zlib.crc32(v4[:-4]) == struct.unpack("<I", v4[-4:])[0]
    o = 8 + 12
    n = struct.unpack_from("<I", v4, o)[0]
    o += 4
    knobs = {}
    for _ in range(n):
        ln = struct.unpack_from("<I", v4, o)[0]
        name = v4[o + 4:o + 4 + ln].decode()
        knobs[name] = v4[o + 4 + ln:o + 8 + ln]
        o += 8 + ln
    body = v4[o:-4]
    keep = OLD_KNOBS[:OLD_COUNT[version]]
    head = b"NCSTRM0%d" % version + v4[8:20] + b"".join(knobs[k] for k in keep)
    if version < 3:
        # no dynamic evaluation byte: the last byte of v4 is has_dyn = 0
        assert body[-1:] == b"\x00", "a blob with dynamic evaluation has no version 1-2 form"
        body = body[:-1]
    out = head + body
    return out + struct.pack("<I", zlib.crc32(out))


def make_model(binp, model, work):
    shutil.copytree(os.path.join(ROOT, "tests/fixtures/lstm-2layer"), model)
    os.unlink(os.path.join(model, "reference.json"))
    corpus = os.path.join(work, "corpus.txt")
    with open(corpus, "w") as f:
        for i in range(200):
            f.write(text_of(40, 50 + i))
    cli = os.path.join(binp, "neurocache")
    subprocess.check_call([cli, "build-index", "--model", model, "--corpus", corpus, "--factory", "IVF16,PQ4np",
                           "--sample", "8000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.check_call([cli, "dyn-stats", "--model", model, "--train", corpus, "--tokens", "4000"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    valid = os.path.join(work, "valid.txt")
    with open(valid, "w") as f:
        for i in range(40):
            f.write(text_of(40, 900 + i))
    subprocess.check_call([cli, "fit-gate", "--model", model, "--valid", valid, "--neural-size", "25",
                           "--unigram-size", "30", "--iters", "50"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def upload(d, ns, doc, text):
    d.ok("POST", "/v1/namespaces/%s/documents?id=%s" % (ns, doc), text.encode(), "text/plain")


def torn_tail(waldir):
    """A crash mid-append: the first half of a record after the last one"""
    last = sorted(f for f in os.listdir(waldir) if f.endswith(".log"))[-1]
    path = os.path.join(waldir, last)
    with open(path, "ab") as f:
        f.write(struct.pack("<IIQ", 0x5257434E, 400, 999999) + b"\x17" * 40)
    return last


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "bin"))
    ap.add_argument("--name", default=None)
    ap.add_argument("--out", default=os.path.join(ROOT, "tests/fixtures"))
    a = ap.parse_args()
    commit = subprocess.check_output(["git", "-C", ROOT, "rev-parse", "--short=7", "HEAD"]).decode().strip()
    out = os.path.join(a.out, a.name or "upgrade-" + commit)
    if os.path.exists(out):
        shutil.rmtree(out)
    work = tempfile.mkdtemp(prefix="nc_fix_")
    model, data, blobs = os.path.join(out, "model"), os.path.join(out, "data"), os.path.join(out, "blobs")
    os.makedirs(blobs)
    make_model(a.bin, model, work)
    log = os.path.join(work, "daemon.log")
    # 1. documents, then a snapshot of each namespace (SIGTERM)
    d = Daemon(a.bin, model, data, log)
    d.ok("PUT", "/v1/namespaces/keys", {})
    d.ok("PUT", "/v1/namespaces/compact", {"storage": "compact"})
    for i in range(2):
        upload(d, "keys", "k%d" % i, doc_text(90, 10 + i))
        upload(d, "compact", "c%d" % i, doc_text(90, 20 + i))
    d.stop(signal.SIGTERM)
    # 2. more documents (log records after the snapshot), sessions, blobs,
    # the predictions; then kill -9 and a torn record
    d = Daemon(a.bin, model, data, log)
    upload(d, "keys", "k2", doc_text(120, 12))
    upload(d, "compact", "c2", doc_text(120, 22))
    exp = {"commit": commit, "daemon_args": DAEMON_ARGS, "namespaces": {}, "probes": []}
    for ns in ("keys", "compact"):
        info = json.loads(d.ok("GET", "/v1/namespaces/" + ns))
        exp["namespaces"][ns] = {"entries": info["entries"], "words": info["words"], "documents": info["documents"],
                                 "storage": info["storage"], "index": info["index"]["type"]}
        exp["probes"].append(ns_probe(d, ns, "p-" + ns))
    envs = {}
    for name, cache in (("plain", PLAIN), ("dyn", DYN)):
        d.ok("POST", "/v1/sessions", {"id": name, "cache": cache})
        d.ok("POST", "/v1/sessions/%s/feed" % name, {"text": doc_text(60, 77)})
        envs[name] = d.ok("GET", "/v1/sessions/%s/state" % name)
    d.stop(signal.SIGKILL)
    exp["torn_tail"] = "keys/wal/" + torn_tail(os.path.join(data, "namespaces/keys/wal"))
    # 3. the blobs' predictions from a daemon started on (a copy of) what
    # the fixture holds, as the test starts one: an imported session's
    # answers depend on the words the daemon knows (open vocabulary), so
    # they are asked in the order the test asks them, the namespaces first;
    # the namespaces must answer as before the kill, bit for bit
    copy = os.path.join(work, "copy")
    shutil.copytree(data, copy)
    d = Daemon(a.bin, model, copy, log)
    for k, ns in enumerate(("keys", "compact")):
        again = ns_probe(d, ns, "q-" + ns)
        if again != exp["probes"][k]:
            sys.exit("namespace %s answers otherwise after kill -9 and recovery" % ns)
    for name in ("plain", "dyn"):
        versions = (1, 2, 3) if name == "plain" else (3,)
        for v in versions + (4,):
            blob = envs[name] if v == 4 else reencode(envs[name], v)
            fn = "%s-v%d.blob" % (name, v)
            with open(os.path.join(blobs, fn), "wb") as f:
                f.write(blob)
            exp["probes"].append(blob_probe(d, blob, fn, "b-%s-%d" % (name, v)))
    d.stop(signal.SIGTERM)
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(exp, f, indent=1)
        f.write("\n")
    shutil.rmtree(work)
    print(out)


if __name__ == "__main__":
    main()
