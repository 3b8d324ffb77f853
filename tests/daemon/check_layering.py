#!/usr/bin/env python3
"""The daemon's request-lifecycle modules stay modules (issue 41).

session_core.h maps the modules over SessionCore; SessionManager (session_manager.h) is the facade
that owns them. This holds the shape to what the map says:
  - session_manager.h stays a facade: under 200 lines;
  - no module (a header or source named in the map) includes session_manager.h, and outside the
    facade's own file only the transports (the edges that serve the public calls) do;
  - the daemon's headers include each other without a cycle;
  - a module includes another module's header only where the map draws its arrow;
  - the modules' sources (and session_core.cc, session_manager.cc) never LOG: they run under the
    daemon's locks, so their lines go through LOCKED_LOG or DEFERRED_LOG (deferred_log.h), which
    write them once the locks are released (issue 41, item 2: nothing logged under a lock).
Exit status 0 when it holds; else each violation is printed and the status is 1.
"""
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
inc_dir = os.path.join(root, "daemon", "include", "hisparse", "daemon")
src_dir = os.path.join(root, "daemon")
problems = []


def includes(path):
    with open(path, encoding="utf-8") as f:
        return re.findall(r'^#include "hisparse/daemon/([a-z_]+)\.h"', f.read(), re.M)


def snake(name):
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


# The map: "//   Name (file.h)   what it does   -> Dep, Dep" lines of session_core.h's top comment.
core_h = open(os.path.join(inc_dir, "session_core.h"), encoding="utf-8").read()
modules = {}  # header stem -> the stems of the modules it may use
for m in re.finditer(r"^//   ([A-Za-z]+) \(([a-z_]+)\.h\)[^\n]*?(?:->\s*([A-Za-z, ]+))?$", core_h, re.M):
    arrows = [a.strip() for a in (m.group(3) or "").split(",") if a.strip()]
    modules[m.group(2)] = {snake(a) for a in arrows}
if len(modules) < 8:
    problems.append(f"session_core.h's module map names {len(modules)} modules; expected the whole map")
by_class = {snake(k): k for k in modules}
# Names in arrows are class names; the header stems are their snake_case, but for one module whose
# file is not its class's name (none today), which would show up as an unknown arrow below.
for stem, deps in modules.items():
    for d in deps:
        if d not in modules:
            problems.append(f"session_core.h: {stem}.h's arrow names {d}, which is not a module of the map")

facade_lines = sum(1 for _ in open(os.path.join(inc_dir, "session_manager.h"), encoding="utf-8"))
if facade_lines >= 200:
    problems.append(f"session_manager.h has {facade_lines} lines: the facade must stay under 200")

# The edges that serve SessionManager's public calls.
may_include_facade = {"session_manager.cc", "daemon.cc", "service.h", "fd_server.h", "control_lanes.h", "metrics.h"}
for directory in (inc_dir, src_dir):
    for name in sorted(os.listdir(directory)):
        if not name.endswith((".h", ".cc")):
            continue
        path = os.path.join(directory, name)
        stem = name.rsplit(".", 1)[0]
        used = includes(path)
        if "session_manager" in used and name not in may_include_facade:
            problems.append(f"daemon/{name} includes session_manager.h (a module uses SessionCore and its peers)")
        if stem in modules:
            for other in used:
                if other in modules and other != stem and other != "session_core" and other not in modules[stem]:
                    problems.append(f"daemon/{name} includes {other}.h: the map draws no arrow {stem} -> {other}")

# Nothing logged under a lock: a plain LOG( in a module's source (comments aside).
for stem in sorted(set(modules) | {"session_core", "session_manager"}):
    path = os.path.join(src_dir, stem + ".cc")
    if not os.path.exists(path):
        continue
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            code = line.split("//", 1)[0]
            if re.search(r"(?<![A-Z_])LOG\(", code):
                problems.append(f"daemon/{stem}.cc:{number} writes a LOG line: use LOCKED_LOG or DEFERRED_LOG")

graph = {n[:-2]: includes(os.path.join(inc_dir, n)) for n in os.listdir(inc_dir) if n.endswith(".h")}
state = {}


def visit(node, stack):
    if state.get(node) == "done":
        return
    if node in stack:
        problems.append("include cycle: " + " -> ".join(stack[stack.index(node):] + [node]))
        return
    for nxt in graph.get(node, []):
        visit(nxt, stack + [node])
    state[node] = "done"


for node in sorted(graph):
    visit(node, [])

for p in problems:
    print("layering:", p)
print(f"layering: {len(modules)} modules, facade {facade_lines} lines, {len(graph)} headers: "
      + ("clean" if not problems else f"{len(problems)} problems"))
sys.exit(1 if problems else 0)
