// Validates rendered Kubernetes manifests (the output of `kubectl kustomize`) offline, three ways:
//  1. schema: every document is loaded into its kubernetes-models class (ServiceMonitor from
//     @kubernetes-models/prometheus-operator) and validate()d against the API's OpenAPI schema
//     (types, enums, required fields, formats). An apiVersion/kind without a model fails.
//  2. strict fields: the schemas allow unknown fields, so a misspelt optional field
//     (`livenesProbe:`) would pass step 1. Every document is therefore also type-checked by the
//     TypeScript compiler as an object literal of the model's interface, whose excess-property
//     check rejects any field the API does not have, at any depth.
//  3. hisparse's own rules: the daemon config's keys are those of deploy/hisparsed.yaml, the pod's
//     memory limit covers the host pool, names and ports that refer to each other match, the pod
//     runs under the NVIDIA container runtime with every GPU visible and none requested from the
//     device plugin.
//
// Usage: node validate-k8s.mjs --reference ../hisparsed.yaml RENDERED.yaml...
// Exit status: 0 when every file passes, 1 otherwise (each problem is printed).
import { readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseAllDocuments, parse as parseYaml } from "yaml";
import ts from "typescript";

const here = path.dirname(fileURLToPath(import.meta.url));

// apiVersion -> module with one class per kind. Anything else is an error: hisparse's manifests
// use only these, and a typo in apiVersion or kind must not pass as "unknown, skipped".
const MODULES = {
  v1: "kubernetes-models/v1",
  "apps/v1": "kubernetes-models/apps/v1",
  "scheduling.k8s.io/v1": "kubernetes-models/scheduling.k8s.io/v1",
  "policy/v1": "kubernetes-models/policy/v1",
  "networking.k8s.io/v1": "kubernetes-models/networking.k8s.io/v1",
  "rbac.authorization.k8s.io/v1": "kubernetes-models/rbac.authorization.k8s.io/v1",
  "monitoring.coreos.com/v1": "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1",
};

const problems = [];
const fail = (where, msg) => problems.push(`${where}: ${msg}`);

function parseArgs(argv) {
  const out = { reference: null, files: [] };
  for (let i = 0; i < argv.length; ++i) {
    if (argv[i] === "--reference") out.reference = argv[++i];
    else out.files.push(argv[i]);
  }
  if (!out.reference || out.files.length === 0) {
    console.error("usage: node validate-k8s.mjs --reference deploy/hisparsed.yaml RENDERED.yaml...");
    process.exit(2);
  }
  return out;
}

// Every document of every file, as { file, index, obj, where }.
function loadDocuments(files) {
  const docs = [];
  for (const file of files) {
    const parsed = parseAllDocuments(readFileSync(file, "utf8"));
    parsed.forEach((d, index) => {
      const where = `${path.basename(file)}#${index}`;
      if (d.errors.length) {
        fail(where, `YAML: ${d.errors.map((e) => e.message).join("; ")}`);
        return;
      }
      const obj = d.toJS();
      if (obj === null || obj === undefined) return;  // an empty document
      const name = `${obj.kind ?? "?"}/${obj.metadata?.name ?? "?"}`;
      docs.push({ file, index, obj, where: `${where} ${name}` });
    });
  }
  return docs;
}

// 1. The schema check. Returns the docs that have a model (for step 2).
async function checkSchemas(docs) {
  const typed = [];
  for (const doc of docs) {
    const { apiVersion, kind } = doc.obj;
    const modulePath = MODULES[apiVersion];
    if (!modulePath) {
      fail(doc.where, `no schema for apiVersion "${apiVersion}"`);
      continue;
    }
    const mod = await import(modulePath);
    const Model = mod[kind];
    if (typeof Model !== "function" || Model.kind !== kind) {
      fail(doc.where, `no kind "${kind}" in ${apiVersion}`);
      continue;
    }
    try {
      new Model(doc.obj).validate();
    } catch (e) {
      fail(doc.where, `schema: ${e.message}`);
    }
    typed.push({ ...doc, modulePath, kind });
  }
  return typed;
}

// 2. The strict-field check: one virtual TypeScript file with each document as a literal.
function checkStrictFields(typed) {
  if (typed.length === 0) return;
  const lines = [];
  const docAtLine = [];
  typed.forEach((doc, i) => {
    lines.push(`import type { I${doc.kind} as T${i} } from "${doc.modulePath}/${doc.kind}";`);
    docAtLine.push(null);
  });
  typed.forEach((doc, i) => {
    const body = JSON.stringify(doc.obj, null, 2).split("\n");
    body[0] = `export const doc${i}: T${i} = ${body[0]}`;
    body[body.length - 1] += ";";
    for (const l of body) {
      lines.push(l);
      docAtLine.push(doc);
    }
  });
  const fileName = path.join(here, "__rendered_manifests__.ts");
  const text = lines.join("\n") + "\n";
  const options = {
    strict: true,
    noEmit: true,
    skipLibCheck: true,
    target: ts.ScriptTarget.ES2020,
    module: ts.ModuleKind.Node16,
    moduleResolution: ts.ModuleResolutionKind.Node16,
    types: [],
  };
  const host = ts.createCompilerHost(options);
  const getSourceFile = host.getSourceFile.bind(host);
  host.getSourceFile = (f, lang, ...rest) =>
    f === fileName ? ts.createSourceFile(f, text, lang) : getSourceFile(f, lang, ...rest);
  const fileExists = host.fileExists.bind(host);
  host.fileExists = (f) => f === fileName || fileExists(f);
  const readFile = host.readFile.bind(host);
  host.readFile = (f) => (f === fileName ? text : readFile(f));
  // Node16 resolution wants to know this virtual file is an ES module.
  const program = ts.createProgram({ rootNames: [fileName], options, host });
  for (const d of ts.getPreEmitDiagnostics(program)) {
    const msg = ts.flattenDiagnosticMessageText(d.messageText, " ");
    if (d.file && d.file.fileName === fileName && d.start !== undefined) {
      const { line } = d.file.getLineAndCharacterOfPosition(d.start);
      const doc = docAtLine[line];
      const src = lines[line].trim();
      fail(doc ? doc.where : `line ${line + 1}`, `strict: ${msg} (at ${src})`);
    } else {
      fail("typescript", msg);
    }
  }
}

// Byte sizes as the daemon reads them (deploy/hisparsed.yaml): powers of 1024 for B K KiB M MiB
// G GiB T TiB, of 1000 for KB MB GB TB.
function daemonBytes(s) {
  const m = /^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$/.exec(String(s));
  if (!m) return NaN;
  const unit = m[2].toLowerCase();
  const table = { "": 1, b: 1, k: 2 ** 10, kib: 2 ** 10, m: 2 ** 20, mib: 2 ** 20, g: 2 ** 30, gib: 2 ** 30,
    t: 2 ** 40, tib: 2 ** 40, kb: 1e3, mb: 1e6, gb: 1e9, tb: 1e12 };
  return unit in table ? Number(m[1]) * table[unit] : NaN;
}

// Kubernetes quantities (the subset used for memory): Ki Mi Gi Ti, k M G T, or plain bytes.
function quantityBytes(q) {
  const m = /^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$/.exec(String(q));
  if (!m) return NaN;
  const table = { Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, k: 1e3, M: 1e6, G: 1e9, T: 1e12 };
  return Number(m[1]) * (m[2] ? table[m[2]] : 1);
}

// The dotted key paths of a parsed YAML mapping ("host_pool.size", ...).
function keyPaths(obj, prefix = "") {
  const out = [];
  for (const [k, v] of Object.entries(obj ?? {})) {
    const p = prefix ? `${prefix}.${k}` : k;
    if (v && typeof v === "object" && !Array.isArray(v)) out.push(...keyPaths(v, p));
    else out.push(p);
  }
  return out;
}

// 3. hisparse's rules over each rendered file (one file = one kustomization).
function checkProject(docs, referenceKeys) {
  const byFile = new Map();
  for (const d of docs) {
    if (!byFile.has(d.file)) byFile.set(d.file, []);
    byFile.get(d.file).push(d);
  }
  for (const [file, list] of byFile) {
    const where = path.basename(file);
    const find = (kind) => list.filter((d) => d.obj.kind === kind).map((d) => d.obj);
    const [ds] = find("DaemonSet");
    const [svc] = find("Service");
    const [sm] = find("ServiceMonitor");
    if (!ds) {
      fail(where, "no DaemonSet");
      continue;
    }
    for (const kind of ["Namespace", "ServiceAccount", "ConfigMap", "Service", "ServiceMonitor"]) {
      if (find(kind).length === 0) fail(where, `no ${kind}`);
    }
    const pod = ds.spec?.template?.spec ?? {};
    const ctr = (pod.containers ?? []).find((c) => c.name === "hisparsed");
    if (!ctr) {
      fail(where, "DaemonSet has no container named hisparsed");
      continue;
    }
    const podLabels = ds.spec?.template?.metadata?.labels ?? {};
    const matches = (selector, labels) =>
      Object.entries(selector ?? {}).every(([k, v]) => labels?.[k] === v) && Object.keys(selector ?? {}).length > 0;
    if (!matches(ds.spec?.selector?.matchLabels, podLabels)) fail(where, "DaemonSet selector does not match its pod labels");
    if (pod.priorityClassName !== "system-node-critical") fail(where, "DaemonSet is not system-node-critical");
    if (pod.serviceAccountName && !list.some((d) => d.obj.kind === "ServiceAccount" && d.obj.metadata?.name === pod.serviceAccountName)) {
      fail(where, `serviceAccountName ${pod.serviceAccountName} is not in the manifests`);
    }
    if (!(ctr.env ?? []).some((e) => e.name === "NODE_NAME" && e.valueFrom?.fieldRef?.fieldPath === "spec.nodeName")) {
      fail(where, "NODE_NAME does not come from the downward API (spec.nodeName)");
    }
    const metricsPort = (ctr.ports ?? []).find((p) => p.name === "metrics");
    if (!metricsPort) fail(where, "container has no port named metrics");
    if (!(ctr.securityContext?.capabilities?.add ?? []).includes("IPC_LOCK")) fail(where, "container lacks CAP_IPC_LOCK");
    for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
      if (!ctr[probe]) fail(where, `container has no ${probe}`);
    }
    // The GPUs: the host's driver through the NVIDIA container runtime, every GPU visible, none
    // taken from the device plugin (the engines need them). runtimeClassName may be dropped where
    // nvidia is the node's default runtime; any other class is a mistake.
    if (pod.runtimeClassName !== undefined && pod.runtimeClassName !== "nvidia") {
      fail(where, `runtimeClassName ${pod.runtimeClassName} is not nvidia (the NVIDIA container runtime mounts libcuda)`);
    }
    const envValue = (name) => (ctr.env ?? []).find((e) => e.name === name)?.value;
    if (envValue("NVIDIA_VISIBLE_DEVICES") !== "all") fail(where, "NVIDIA_VISIBLE_DEVICES is not all");
    if (!(envValue("NVIDIA_DRIVER_CAPABILITIES") ?? "").split(",").includes("compute")) {
      fail(where, "NVIDIA_DRIVER_CAPABILITIES does not include compute (libcuda.so.1)");
    }
    for (const part of ["requests", "limits"]) {
      for (const k of Object.keys(ctr.resources?.[part] ?? {})) {
        if (k.startsWith("nvidia.com/")) fail(where, `the daemon ${part.slice(0, -1)}s ${k}: it would take a GPU from the engines`);
      }
    }
    // The socket directory: a hostPath on /run/hisparse mounted at /run/hisparse.
    const runVol = (pod.volumes ?? []).find((v) => v.hostPath?.path === "/run/hisparse");
    if (!runVol) fail(where, "no hostPath volume for /run/hisparse");
    else if (!(ctr.volumeMounts ?? []).some((m) => m.name === runVol.name && m.mountPath === "/run/hisparse")) {
      fail(where, "the /run/hisparse hostPath is not mounted at /run/hisparse");
    }
    if (svc) {
      if (!matches(svc.spec?.selector, podLabels)) fail(where, "metrics Service selector does not match the pods");
      const sp = (svc.spec?.ports ?? []).find((p) => p.name === "metrics");
      if (!sp) fail(where, "metrics Service has no port named metrics");
      else if (metricsPort && sp.targetPort !== "metrics" && sp.targetPort !== metricsPort.containerPort) {
        fail(where, "metrics Service targetPort is not the container's metrics port");
      }
      if (sm) {
        if (!matches(sm.spec?.selector?.matchLabels, svc.metadata?.labels)) fail(where, "ServiceMonitor selector does not match the Service");
        if (!(sm.spec?.endpoints ?? []).some((e) => e.port === "metrics")) fail(where, "ServiceMonitor scrapes no port named metrics");
      }
    }
    // Every ConfigMap the pod refers to is in the manifests; the daemon's is checked further.
    const cms = new Map(find("ConfigMap").map((c) => [c.metadata?.name, c]));
    const refs = [
      ...(pod.volumes ?? []).filter((v) => v.configMap).map((v) => v.configMap.name),
      ...(ctr.env ?? []).filter((e) => e.valueFrom?.configMapKeyRef).map((e) => e.valueFrom.configMapKeyRef.name),
    ];
    for (const r of refs) if (!cms.has(r)) fail(where, `ConfigMap ${r} is referred to but not in the manifests`);
    for (const e of ctr.env ?? []) {
      const ref = e.valueFrom?.configMapKeyRef;
      if (ref && cms.has(ref.name) && !(ref.key in (cms.get(ref.name).data ?? {}))) {
        fail(where, `env ${e.name}: ConfigMap ${ref.name} has no key ${ref.key}`);
      }
    }
    const cfgVol = (pod.volumes ?? []).find((v) => v.configMap && (v.configMap.items ?? []).some((i) => i.key === "hisparsed.yaml"));
    const cm = cfgVol && cms.get(cfgVol.configMap.name);
    if (!cm || !cm.data?.["hisparsed.yaml"]) {
      fail(where, "no ConfigMap with hisparsed.yaml mounted into the pod");
      continue;
    }
    let cfg;
    try {
      cfg = parseYaml(cm.data["hisparsed.yaml"]);
    } catch (e) {
      fail(where, `hisparsed.yaml: ${e.message}`);
      continue;
    }
    for (const k of keyPaths(cfg)) {
      if (!referenceKeys.has(k)) fail(where, `hisparsed.yaml: key ${k} is not a hisparsed config key (deploy/hisparsed.yaml)`);
    }
    const pool = daemonBytes(cfg?.host_pool?.size ?? "1GiB");
    const req = quantityBytes(ctr.resources?.requests?.memory);
    const lim = quantityBytes(ctr.resources?.limits?.memory);
    if (!Number.isFinite(pool)) fail(where, `hisparsed.yaml: host_pool.size "${cfg.host_pool.size}" is not a byte size`);
    if (!Number.isFinite(lim)) fail(where, "container has no memory limit");
    if (req !== lim) fail(where, `memory request (${ctr.resources?.requests?.memory}) differs from the limit (${ctr.resources?.limits?.memory})`);
    const hugepages = quantityBytes(ctr.resources?.limits?.["hugepages-2Mi"] ?? "0");
    const poolOnHugepages = cfg?.host_pool?.hugepages === "on" && hugepages >= pool;
    if (!poolOnHugepages && lim < pool + 2 ** 29) {
      fail(where, `memory limit ${ctr.resources?.limits?.memory} does not cover host_pool.size ${cfg.host_pool.size} plus 512Mi for the daemon`);
    }
    if (cfg?.host_pool?.mlock === true && !(ctr.securityContext?.capabilities?.add ?? []).includes("IPC_LOCK")) {
      fail(where, "host_pool.mlock is true but the container has no IPC_LOCK");
    }
    // /metrics must be reachable from the scraper: on the pod IP, at the container's metrics port.
    const ml = cfg?.metrics?.listen ?? "127.0.0.1:9464";
    const mport = Number(ml.slice(ml.lastIndexOf(":") + 1));
    if (ml === "") fail(where, "hisparsed.yaml: metrics.listen is empty (metrics off) but a ServiceMonitor scrapes them");
    else if (/^(127\.|localhost|\[::1\])/.test(ml)) fail(where, `hisparsed.yaml: metrics.listen ${ml} is loopback: no scrape reaches it`);
    else if (metricsPort && mport !== metricsPort.containerPort) {
      fail(where, `hisparsed.yaml: metrics.listen port ${mport} is not the container's metrics port ${metricsPort.containerPort}`);
    }
    if (cfg?.listen && cfg.listen !== "unix:/run/hisparse/hisparsed.sock" && cfg.listen !== "unix:///run/hisparse/hisparsed.sock") {
      fail(where, `hisparsed.yaml: listen ${cfg.listen} is not on the shared /run/hisparse hostPath`);
    }
  }
}

const args = parseArgs(process.argv.slice(2));
const referenceKeys = new Set(keyPaths(parseYaml(readFileSync(args.reference, "utf8"))));
const docs = loadDocuments(args.files);
const typed = await checkSchemas(docs);
checkStrictFields(typed);
checkProject(docs, referenceKeys);

if (process.env.VERBOSE) for (const d of docs) console.log(`  checked ${d.where}`);
if (problems.length) {
  for (const p of problems) console.error(`FAIL ${p}`);
  console.error(`validate-k8s: ${problems.length} problem(s) in ${args.files.length} file(s)`);
  process.exit(1);
}
const kinds = [...new Set(docs.map((d) => d.obj.kind))].join(", ");
console.log(`validate-k8s: ${docs.length} documents (${kinds}) in ${args.files.length} renderings: schema, strict fields and hisparse rules OK`);
