// Lints a Dockerfile without a Docker engine (none runs where CI does), three ways:
//  1. dockerfile-utils (the validator behind VS Code's Docker language server): syntax and
//     semantics of every instruction: unknown instructions, bad flags (COPY --frm), malformed
//     JSON arrays, ports, stage names that COPY --from refers to, duplicate stage names, ...
//     Errors and warnings both fail.
//  2. dockerfilelint: practices: base images without a tag or with :latest, apt-get without -y,
//     sudo, missing apt list clean-up, ...
//  3. hisparse's own rules: a multi-stage build whose COPY --from names earlier stages; a non-root USER in the final stage; the daemon as
//     ENTRYPOINT with --config /etc/hisparse/hisparsed.yaml as its default arguments; no NVIDIA
//     driver or CUDA library installed or copied into the final stage, which sets
//     NVIDIA_VISIBLE_DEVICES=all and NVIDIA_DRIVER_CAPABILITIES with compute (the host's driver
//     comes from the NVIDIA Container Toolkit at run time).
// Neither tool builds the image: whether the packages install and the build succeeds inside it is
// checked by tools/check-deploy.sh on this (same Debian 12) machine instead.
//
// Usage: node lint-dockerfile.mjs Dockerfile   Exit status 0 clean, 1 problems (printed).
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { validate as dockerfileUtilsValidate } from "dockerfile-utils";

const require = createRequire(import.meta.url);
const dockerfilelint = require("dockerfilelint");

const file = process.argv[2];
if (!file) {
  console.error("usage: node lint-dockerfile.mjs Dockerfile");
  process.exit(2);
}
const content = readFileSync(file, "utf8");
const problems = [];

// 1. dockerfile-utils. Severity 1 = error, 2 = warning (LSP DiagnosticSeverity).
for (const d of dockerfileUtilsValidate(content)) {
  const sev = d.severity === 1 ? "error" : d.severity === 2 ? "warning" : "note";
  if (d.severity <= 2) problems.push(`${file}:${d.range.start.line + 1}: dockerfile-utils ${sev}: ${d.message}`);
}

// 2. dockerfilelint (default rules; no .dockerfilelintrc).
for (const item of dockerfilelint.run(process.cwd(), content)) {
  problems.push(`${file}:${item.line}: dockerfilelint ${item.category}: ${item.title}: ${item.description}`);
}

// 3. hisparse's rules, over the instructions (continuation lines joined, comments dropped).
const instructions = [];
{
  let pending = "";
  content.split(/\r?\n/).forEach((raw, i) => {
    const line = raw.trim();
    if (!pending && (line === "" || line.startsWith("#"))) return;
    if (pending && line.startsWith("#")) return;
    pending += (pending ? " " : "") + line.replace(/\\$/, "").trim();
    if (!line.endsWith("\\")) {
      const m = /^(\S+)\s*(.*)$/.exec(pending);
      instructions.push({ line: i + 1, op: m[1].toUpperCase(), args: m[2] });
      pending = "";
    }
  });
}
const froms = instructions.filter((x) => x.op === "FROM");
if (froms.length < 2) problems.push(`${file}: expected a multi-stage build (a build stage and a runtime stage)`);
// COPY --from names an earlier stage: an unknown name would silently pull an image of that name.
const stages = [];
for (const x of instructions) {
  if (x.op === "FROM") {
    const m = /\s+AS\s+(\S+)\s*$/i.exec(x.args);
    stages.push(m ? m[1].toLowerCase() : String(stages.length));
  }
  const from = x.op === "COPY" ? /--from=(\S+)/.exec(x.args) : null;
  if (from && !stages.slice(0, -1).includes(from[1].toLowerCase())) {
    problems.push(`${file}:${x.line}: COPY --from=${from[1]} is not an earlier stage (${stages.slice(0, -1).join(", ") || "none"})`);
  }
}
const lastFrom = instructions.lastIndexOf(froms[froms.length - 1]);
const final = instructions.slice(lastFrom);
const users = final.filter((x) => x.op === "USER");
const user = users.length ? users[users.length - 1].args.split(":")[0] : "root";
if (user === "root" || user === "0") problems.push(`${file}: the final stage runs as root (no non-root USER)`);
const jsonArgs = (op) => {
  const x = final.filter((i) => i.op === op).pop();
  if (!x) return null;
  try {
    return JSON.parse(x.args);
  } catch {
    problems.push(`${file}:${x.line}: ${op} is not in exec (JSON array) form`);
    return null;
  }
};
const entrypoint = jsonArgs("ENTRYPOINT");
const cmd = jsonArgs("CMD");
if (!entrypoint || !/(^|\/)hisparsed$/.test(entrypoint[0] ?? "")) {
  problems.push(`${file}: ENTRYPOINT is not ["hisparsed"] (or its absolute path)`);
}
const args = [...(entrypoint ?? []).slice(1), ...(cmd ?? [])].join(" ").replace("=", " ");
if (!/--config \/etc\/hisparse\/hisparsed\.yaml/.test(args)) {
  problems.push(`${file}: the default arguments are not --config /etc/hisparse/hisparsed.yaml`);
}

// The NVIDIA driver comes from the host (the NVIDIA Container Toolkit mounts it at run time): the
// final stage installs and copies no driver or CUDA library, and sets what the toolkit reads.
for (const x of final) {
  const text = x.args.toLowerCase();
  if (x.op === "RUN" && /apt-get install/.test(text) && /\s(libcuda\S*|libnvidia\S*|nvidia-\S+|cuda-\S+)/.test(text)) {
    problems.push(`${file}:${x.line}: the final stage installs an NVIDIA driver or CUDA package (the host's driver is mounted at run time)`);
  }
  if (x.op === "COPY" && (/--from=cuda\b/.test(text) || /libcuda|libnvidia|\/usr\/local\/cuda/.test(text))) {
    problems.push(`${file}:${x.line}: the final stage copies CUDA or driver files (the host's driver is mounted at run time)`);
  }
}
const env = {};
for (const x of final.filter((i) => i.op === "ENV")) {
  for (const m of x.args.matchAll(/([A-Za-z_][A-Za-z0-9_]*)=("[^"]*"|\S*)/g)) env[m[1]] = m[2].replace(/^"|"$/g, "");
}
if (env.NVIDIA_VISIBLE_DEVICES !== "all") {
  problems.push(`${file}: the final stage does not set NVIDIA_VISIBLE_DEVICES=all (the daemon serves every GPU of the node)`);
}
if (!(env.NVIDIA_DRIVER_CAPABILITIES ?? "").split(",").includes("compute")) {
  problems.push(`${file}: NVIDIA_DRIVER_CAPABILITIES does not include compute (libcuda.so.1)`);
}

if (problems.length) {
  for (const p of problems) console.error(`FAIL ${p}`);
  console.error(`lint-dockerfile: ${problems.length} problem(s)`);
  process.exit(1);
}
console.log(`lint-dockerfile: ${file}: ${instructions.length} instructions, ${froms.length} stages: dockerfile-utils, dockerfilelint and hisparse rules OK`);
