#!/usr/bin/env python3
"""The workspace's crate graph, for docs/architecture.md ("Crates").

    python3 eval/crate-graph.py            # prints the table (markdown)
    python3 eval/crate-graph.py --write    # replaces the table in docs/architecture.md
    python3 eval/crate-graph.py --check    # exits 1 on a product crate that depends on the lab,
                                           # or on a circle between the files of one crate

One row per crate: lines of Rust in src/ (tests under tests/ and benches/ not counted; unit tests
inside src/ are), what it owns (its Cargo.toml description) and the workspace crates it depends
on. A file's dependencies are the modules it names (`crate::a::b`, `super::x`, grouped
`use crate::{a, b}`; comments and unit tests left out); two files that name each other,
directly or round a longer loop, are a circle (a module and its own child are not).
"""

import json
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- crate-graph: begin (python3 eval/crate-graph.py --write) -->"
END = "<!-- crate-graph: end -->"
LAB = "telemark-lab"
# The binary composes the product and the lab; it is the only crate allowed to depend on both.
SHELL = "telemark"


def metadata():
    out = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out)["packages"]


def lines(src: pathlib.Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in src.rglob("*.rs"))


def module_of(crate_src: pathlib.Path, f: pathlib.Path) -> str:
    rel = f.relative_to(crate_src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("lib", "main", "mod"):
        parts = parts[:-1]
    return "::".join(parts)


def circles(crate_src: pathlib.Path):
    """Circles between the modules of one crate, as lists of module names."""
    files = sorted(crate_src.rglob("*.rs"))
    mods = {module_of(crate_src, f): f for f in files}
    edges = {}
    for m, f in mods.items():
        text = f.read_text()
        # Unit tests may reach anywhere in their crate: only the code above them counts.
        text = text.split("#[cfg(test)]")[0]
        # Comments name modules without needing them.
        text = re.sub(r"//[^\n]*", "", text)
        # Grouped imports, `use crate::{a, b::c}` and `use super::{x, y}`, as one path each.
        for root, body in re.findall(r"\b(crate|super)::\{([^}]*)\}", text):
            text += " " + " ".join(f"{root}::{item.strip()}" for item in body.split(","))
        paths = re.findall(r"\bcrate::((?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*)", text)
        # `super::x` from module a::b::c is a::b::x (from a file at the root, the crate root).
        parent = m.split("::")[:-1] if m else []
        for path in re.findall(r"\bsuper::((?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*)", text):
            paths.append("::".join(parent + path.split("::")))
        names = set()
        for path in paths:
            parts = path.split("::")
            # The longest prefix that is a module of this crate.
            for k in range(len(parts), 0, -1):
                cand = "::".join(parts[:k])
                if cand in mods:
                    names.add(cand)
                    break
        names.discard(m)
        # A parent module naming its children, or a child its parent, is structure, not a
        # dependency between peers.
        edges[m] = {n for n in names
                    if not (m == "" or n.startswith(m + "::") or m.startswith(n + "::"))}
    found, state, stack = [], {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(edges.get(m, ())):
            if state.get(n) == 1:
                found.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(mods):
        if m not in state:
            visit(m)
    return found


def main():
    pkgs = metadata()
    names = {p["name"] for p in pkgs}
    rows, problems = [], []
    order = {n: i for i, n in enumerate([
        "telemark-wire", "telemark-socket", "telemark-core", "telemark-datapath",
        "telemark-transport", "telemark-kafka", "telemark-collector", "telemark-agent",
        "telemark-int-collector", "telemark-lab", "telemark",
    ])}
    for p in sorted(pkgs, key=lambda p: order.get(p["name"], 99)):
        src = pathlib.Path(p["manifest_path"]).parent / "src"
        deps = sorted({d["name"] for d in p["dependencies"]
                       if d["name"] in names and d.get("kind") is None},
                      key=lambda n: order.get(n, 99))
        if LAB in deps and p["name"] != SHELL:
            problems.append(f"{p['name']} depends on the lab")
        for c in circles(src):
            problems.append(f"{p['name']}: circle {' -> '.join(c)}")
        dep_text = ", ".join(f"`{d}`" for d in deps) or "—"
        rows.append(f"| `{p['name']}` | {lines(src):,} | {p['description']} | {dep_text} |")
    table = "\n".join(
        ["| crate | lines | what it owns | depends on |", "|---|---:|---|---|"] + rows)
    if "--check" in sys.argv:
        for x in problems:
            print(x)
        print("ok" if not problems else f"{len(problems)} problem(s)")
        sys.exit(1 if problems else 0)
    if "--write" in sys.argv:
        doc = DOC.read_text()
        a, b = doc.index(BEGIN) + len(BEGIN), doc.index(END)
        DOC.write_text(doc[:a] + "\n" + table + "\n" + doc[b:])
    else:
        print(table)
    for x in problems:
        print(f"problem: {x}", file=sys.stderr)


if __name__ == "__main__":
    main()
