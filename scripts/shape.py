#!/usr/bin/env python3
"""The shape of the house, checked in every crate of the workspace (the
daemon, guard-common, guard-wire, the plugin, the eBPF program, xtask): no
file over 500 lines and no function over 80 lines outside tests, and no
import cycle between a crate's files; in the daemon (guard/src) and in the
plugin (kubectl-arp_guard/src), imports between the layers also flow one
way only (no wrong-way import).

Usage: scripts/shape.py [--graph]   (exit status 1 on a violation)
SHAPE_ROOT=DIR checks that one source folder as the daemon's.
"""
import os, re, sys

HOUSE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
# The daemon's layered source, then the other crates' (sizes and cycles).
ROOT = os.environ.get("SHAPE_ROOT") or os.path.join(HOUSE, "guard", "src")
CRATES = (
    []
    if os.environ.get("SHAPE_ROOT")
    else [
        os.path.join(HOUSE, c, "src")
        for c in ("guard-common", "guard-wire", "kubectl-arp_guard", "guard-ebpf", "xtask")
    ]
)
MAX_FILE, MAX_FN = 500, 80
# Each layer may import only the layers after it (lower in the house).
LAYERS = ["main", "reference", "commands", "cli", "probe", "daemon", "senders", "api", "telemetry", "sources", "datapath", "model", "ops", "testing"]
# The plugin's modules, in the same sense: one command (ask) over the pure
# merge and views, over the asking, over the API's reads and the client.
PLUGIN = os.path.join(HOUSE, "kubectl-arp_guard", "src")
PLUGIN_LAYERS = ["main", "ask", "complete", "status", "views", "fanout", "exec", "cluster", "connect", "output"]
# Reached by every layer: the test-only surface imports from all of them.
ALLOWED_UP = {("testing", l) for l in LAYERS}


def strip_tests(text):
    """The text without `#[cfg(test)] mod tests { ... }` blocks."""
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*\n\s*mod \w+ \{", text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth, j = 0, m.end() - 1
        while j < len(text):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
            if depth == 0:
                break
        i = j
    out.append(text[i:])
    return "".join(out)


FN = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)")


def long_functions(lines):
    """(name, first line, length) of each function longer than MAX_FN."""
    found = []
    for n, line in enumerate(lines):
        m = FN.match(line)
        if not m:
            continue
        depth, started = 0, False
        for k in range(n, len(lines)):
            code = re.sub(r'"([^"\\]|\\.)*"|//.*', "", lines[k])
            depth += code.count("{") - code.count("}")
            started |= "{" in code
            if started and depth <= 0:
                break
            if not started and code.rstrip().endswith(";"):
                break  # a declaration without a body
        if k - n + 1 > MAX_FN:
            found.append((m.group(6), n + 1, k - n + 1))
    return found


def crate_paths(text):
    """The first segment of every `crate::` path, grouped imports included."""
    found = set(re.findall(r"\bcrate::(\w+)", text))
    for m in re.finditer(r"\bcrate::\{", text):
        depth, j, seg = 1, m.end(), ""
        while j < len(text) and depth:
            c = text[j]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            elif depth == 1 and c == ",":
                seg = ""
            if depth == 1 and (c.isalnum() or c == "_"):
                seg += c
            elif depth == 1 and c == ":" and seg:
                found.add(seg)
                seg = "\0"
            j += 1
        found.discard("\0")
    return found


def module_of(rel):
    parts = rel[:-3].split(os.sep)
    if parts[-1] == "mod":
        parts = parts[:-1]
    return tuple(p for p in parts if p not in ("lib", "main"))


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e] (as lists of segments)."""
    tree = re.sub(r"\s+", "", tree)
    if "{" not in tree:
        return [tree.split("::")]
    head, rest = tree.split("{", 1)
    inner = rest[: rest.rindex("}")]
    items, depth, cur = [], 0, ""
    for c in inner:
        if c == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += {"{": 1, "}": -1}.get(c, 0)
        cur += c
    items.append(cur)
    prefix = [p for p in head.split("::") if p]
    return [prefix + sub for it in items if it for sub in expand_use(it)]


def module_refs(me, text, modules):
    """Modules of the crate that the file of module `me` refers to (in its
    code: a path in a comment is no import)."""
    text = re.sub(r"//.*", "", text)
    paths = []
    for m in re.finditer(r"\buse\s+((crate|super|self)::[^;]*);", text):
        paths += expand_use(m.group(1))
    paths += [m.group(0).split("::") for m in re.finditer(r"\b(crate|super)(::\w+)+", text)]
    out = set()
    for p in paths:
        base = list(me)
        while p and p[0] in ("super", "self", "crate"):
            head = p.pop(0)
            if head == "crate":
                base = []
            elif head == "super":
                base = base[:-1]
        full = tuple(base + [x.split(" as ")[0] for x in p])
        while full and full not in modules:
            full = full[:-1]
        if full and full != me:
            out.add(full)
    return out


def cycles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def layer_of(rel):
    parts = rel[:-3].split(os.sep)
    return "lib" if parts == ["lib"] else parts[0]


def related(a, b):
    """One module inside the other (a parent and the files of its children
    are one unit: `impl Datapath` is spread over datapath/*.rs)."""
    return a[: len(b)] == b or b[: len(a)] == a


def read_crate(root, label, bad):
    """The crate's files outside tests by module, with their size problems."""
    texts = {}
    for dirpath, _, files in os.walk(root):
        for f in sorted(files):
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, root)
            text = strip_tests(open(path).read())
            texts[module_of(rel)] = (rel, text)
            lines = text.splitlines()
            shown = os.path.join(label, rel)
            if len(lines) > MAX_FILE:
                bad.append(f"{shown}: {len(lines)} lines outside tests (at most {MAX_FILE})")
            for name, at, length in long_functions(lines):
                bad.append(f"{shown}:{at}: fn {name} is {length} lines (at most {MAX_FN})")
    return texts


def wrong_way(texts, layers, label, bad):
    """Imports of a crate's top-level modules against `layers`' order
    (`super::` from a top-level file is the crate's root)."""
    modules = set(texts)
    for m, (rel, text) in texts.items():
        me = layer_of(rel)
        if me not in layers:
            continue
        for r in module_refs(m, text, modules):
            other = r[0] if r else None
            if other in layers and other != me and layers.index(other) <= layers.index(me):
                bad.append(f"wrong-way import in {label}: {me} -> {other}")


def crate_cycles(texts, label, bad):
    modules = set(texts)
    graph = {
        m: {r for r in module_refs(m, t, modules) if not related(m, r)}
        for m, (_, t) in texts.items()
    }
    for comp in cycles(graph):
        bad.append(f"import cycle in {label}: " + " <-> ".join("::".join(m) for m in comp))


def main():
    bad, edges = [], {}
    texts = read_crate(ROOT, "" if os.environ.get("SHAPE_ROOT") else "guard/src", bad)
    for rel, text in texts.values():
        me = layer_of(rel)
        for other in crate_paths(text):
            if other != me and other in LAYERS:
                edges.setdefault(me, set()).add(other)
        if me == "main":
            for other in set(re.findall(r"\bguard::(\w+)", text)):
                edges.setdefault(me, set()).add(other)
    for a, targets in sorted(edges.items()):
        for b in sorted(targets):
            if (a, b) in ALLOWED_UP or a == "lib":
                continue
            if a in LAYERS and b in LAYERS and LAYERS.index(b) <= LAYERS.index(a):
                bad.append(f"wrong-way import: {a} -> {b}")
    crate_cycles(texts, "guard/src", bad)
    for root in CRATES:
        label = os.path.relpath(root, HOUSE)
        texts = read_crate(root, label, bad)
        crate_cycles(texts, label, bad)
        if root == PLUGIN:
            wrong_way(texts, PLUGIN_LAYERS, label, bad)
    if "--graph" in sys.argv:
        for a in LAYERS:
            known = [b for b in LAYERS if b in edges.get(a, ())]
            print(f"{a:10} -> {', '.join(known) or '-'}")
    for b in bad:
        print(b)
    print(f"shape: {len(bad)} problem(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
