#!/usr/bin/env python3
"""Fails when the files of a crate import each other in a circle.

Each source file under crates/*/src is a module (lib.rs and main.rs the root, x/mod.rs the
module x). A file depends on another when its non-test code names a path into it: `use
crate::a::b`, `super::x`, `self::y` (also inside `{...}` groups and in expressions), resolved to
the longest prefix that is a file. `mod x;` declarations are structure, not dependencies, and
`#[cfg(test)] mod ... { }` blocks are left out (a test may use anything). Re-exports (`pub
use`) are aliases, not dependencies: `crate::KvError` counts as a use of the module that defines
it, not of the root that re-exports it.

    scripts/check-module-cycles.py [CRATE_DIR ...]     # default: every crates/*

Prints each circle as `crate: a -> b -> a` and exits 1 when there is one. Every run first checks
itself on a planted crate (`self_test`): circles through `super::` and a child's bare name in
files that are not `mod.rs`, which an earlier version resolved one level too high and missed.
"""
import re
import sys
from pathlib import Path


def strip(text):
    """Comments, strings and char literals out; test modules out."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            out.append('""')
            i = n if end < 0 else end + 1 + len(hashes)
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            out.append('""')
            i += 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]) or text.startswith("'\\u{", i):
            j = text.find("'", i + 1 if text[i + 1] != "\\" else i + 2)
            out.append("' '")
            i = j + 1
        else:
            out.append(c)
            i += 1
    code = "".join(out)
    # Test modules: `#[cfg(test)]` then `mod name {` up to the matching brace.
    while True:
        m = re.search(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", code)
        if not m:
            return code
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        code = code[:m.start()] + code[j:]


def module_path(src, f):
    rel = f.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("lib", "main", "mod"):
        parts = parts[:-1]
    return tuple(parts)


def use_paths(code, start):
    """The paths of the use tree (or plain path) that begins at `start` (just after a
    `crate`, `super` or `self` keyword), each as a list of segments."""
    pos = start

    def tree(prefix):
        nonlocal pos
        paths = []
        segs = list(prefix)
        while True:
            m = re.match(r"\s*::\s*", code[pos:])
            if not m:
                break
            pos += m.end()
            if code.startswith("{", pos):
                pos += 1
                while True:
                    m = re.match(r"\s*", code[pos:])
                    pos += m.end()
                    if code.startswith("}", pos):
                        pos += 1
                        break
                    m = re.match(r"(self|super|crate|\w+|\*)", code[pos:])
                    if not m:
                        pos += 1
                        continue
                    pos += m.end()
                    word = m.group(1)
                    if word == "self":
                        paths.append(segs)
                    elif word != "*":
                        paths.extend(tree(segs + [word]))
                    m = re.match(r"\s*(as\s+\w+)?\s*,?", code[pos:])
                    pos += m.end()
                return paths
            m = re.match(r"(\w+|\*)", code[pos:])
            if not m:
                break
            pos += m.end()
            if m.group(1) == "*":
                break
            segs.append(m.group(1))
        paths.append(segs)
        return paths

    return tree([])


def parse_tree(text):
    """The paths of a use tree such as `crate::a::{b, c::D as E, self}`: (segments, alias)."""
    toks = re.findall(r"::|\{|\}|,|\*|\w+", text)
    pos = 0

    def tree(prefix):
        nonlocal pos
        segs = list(prefix)
        out = []
        while pos < len(toks):
            t = toks[pos]
            if t == "{":
                pos += 1
                while pos < len(toks) and toks[pos] != "}":
                    if toks[pos] == ",":
                        pos += 1
                        continue
                    out.extend(tree(segs))
                pos += 1
                return out
            if t == "*":
                pos += 1
                return [(segs, None)]
            if t == "::":
                pos += 1
                continue
            if t in (",", "}"):
                break
            if t == "as":
                alias = toks[pos + 1] if pos + 1 < len(toks) else None
                pos += 2
                return [(segs, alias)]
            if t == "self" and segs:
                pos += 1
                continue
            segs.append(t)
            pos += 1
        return out + [(segs, None)]

    return tree([])


def check_crate(crate):
    src = crate / "src"
    files = sorted(src.rglob("*.rs"))
    if not files:
        return []
    roots = [f for f in files if f.name in ("lib.rs", "main.rs")]
    modules = {module_path(src, f): f for f in files}
    is_dir = {m: f.name in ("lib.rs", "main.rs", "mod.rs") for m, f in modules.items()}
    codes = {m: strip(f.read_text()) for m, f in modules.items()}

    def absolute(here, segs):
        """A path as written in module `here` (crate::, self::, super::, a child module's
        name, or `Name` of an alias) made absolute; None when it leaves the crate."""
        if not segs:
            return None
        head, rest = segs[0], segs[1:]
        if head == "crate":
            return list(rest)
        if head == "self":
            return list(here) + list(rest)
        # `super` is the parent module and a bare name a child of this module, whether the
        # module is a `mod.rs`, a `lib.rs` or a plain `x.rs` file (the file layout changes where
        # a module's children live on disk, not what they are called).
        if head == "super":
            base = list(here)[:-1]
            while rest and rest[0] == "super":
                base, rest = base[:-1], rest[1:]
            return base + list(rest)
        child = tuple(here) + (head,)
        if child in modules:
            return list(child) + list(rest)
        return None

    # Re-exports (`pub use`, `pub(crate) use`) are aliases, not dependencies: a path that names
    # one is followed to what it names.
    aliases = {m: {} for m in modules}
    uses = {m: [] for m in modules}
    use_re = re.compile(r"(?<![\w])(pub(\s*\([^)]*\))?\s+)?use\s+([^;]+);")
    for m, code in codes.items():
        for u in use_re.finditer(code):
            for segs, alias in parse_tree(u.group(3)):
                if u.group(1):
                    name = alias or (segs[-1] if segs else None)
                    if name:
                        aliases[m][name] = segs
                else:
                    uses[m].append(segs)
        codes[m] = use_re.sub(" ", code)

    def target(here, segs, depth=0):
        full = absolute(here, segs)
        if full is None:
            return None
        for k in range(len(full), -1, -1):
            mod = tuple(full[:k])
            if mod in modules:
                rest = full[k:]
                if rest and rest[0] in aliases[mod] and depth < 8:
                    followed = target(mod, aliases[mod][rest[0]], depth + 1)
                    if followed is not None:
                        return followed
                return mod
        return None

    edges = {m: set() for m in modules}
    for m, code in codes.items():
        paths = list(uses[m])
        for hit in re.finditer(r"(?<![\w:])(crate|super|self)(?=\s*::)", code):
            paths.extend([hit.group(1)] + segs for segs in use_paths(code, hit.end()))
        for segs in paths:
            t = target(m, segs)
            if t is not None and t != m:
                edges[m].add(t)
    # Tarjan's strongly connected components.
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
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
                sccs.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(modules):
        if v not in index:
            visit(v)
    name = lambda m: "::".join(m) or ("main" if any(r.name == "main.rs" for r in roots) else "lib")
    out = []
    for comp in sccs:
        comp_set = set(comp)
        # One circle through the component, for the message.
        start = min(comp)
        path, seen, v = [start], {start}, start
        while True:
            nxt = sorted(w for w in edges[v] if w in comp_set)
            w = next((x for x in nxt if x == start and len(path) > 1), None) or next(
                (x for x in nxt if x not in seen), None) or start
            path.append(w)
            if w == start:
                break
            seen.add(w)
            v = w
        out.append(f"{crate.name}: " + " -> ".join(name(p) for p in path)
                   + f"  (component: {', '.join(sorted(name(c) for c in comp))})")
    return out


PLANTED = {
    "lib.rs": "mod api;\npub struct Root;\n",
    # api <-> api::stream: the parent names a child, the child `super::` (the parent).
    "api/mod.rs": "mod fields;\nmod stream;\nmod tools;\nmod validate;\npub struct Log;\nfn f() { self::stream::go(); }\n",
    "api/stream.rs": "use super::Log;\npub fn go() {}\n",
    # api::fields <-> api::validate: siblings through `super::`, in plain files.
    "api/fields.rs": "use super::validate::Endpoint;\npub fn check() {}\n",
    "api/validate.rs": "pub enum Endpoint {}\nfn v() { super::fields::check(); }\n",
    # api::tools <-> api::tools::schema: a plain file names its child bare, the child `super::`.
    "api/tools.rs": "mod schema;\nuse schema::s;\npub struct Tools;\n",
    "api/tools/schema.rs": "use super::Tools;\npub fn s() {}\n",
    "api/validate/rules.rs": "use crate::Root;\n",
    # No circle: a child reaching the crate root, and the root left alone.
    "api/validate/more.rs": "use super::super::fields::check;\n",
}


def self_test():
    """The planted crate's circles are found, and only those."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        crate = Path(d) / "planted"
        for rel, text in PLANTED.items():
            f = crate / "src" / rel
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text)
        found = sorted(line.split("(component: ")[1].rstrip(")") for line in check_crate(crate))
    want = ["api, api::stream", "api::fields, api::validate", "api::tools, api::tools::schema"]
    if found != want:
        print(f"check-module-cycles self-test failed: found {found}, want {want}", file=sys.stderr)
        return False
    return True


def main():
    if not self_test():
        return 2
    root = Path(__file__).resolve().parent.parent
    crates = [Path(a) for a in sys.argv[1:]] or sorted(p for p in (root / "crates").iterdir() if (p / "src").is_dir())
    problems = [line for c in crates for line in check_crate(c)]
    for line in problems:
        print("import circle:", line)
    if problems:
        print(f"{len(problems)} import circle(s) between files; break them by moving the shared item into a "
              "module both can import", file=sys.stderr)
        return 1
    print(f"no import circles between files in {len(crates)} crates")
    return 0


if __name__ == "__main__":
    sys.exit(main())
