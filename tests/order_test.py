"""order_test.py SPMD SOURCE_DIR TMP: propagation and partitioning do not
depend on the order of ops (docs/partitioning.md).

For every example, every tests/models/part_*.yaml, the models of
tests/pending, shared, shardy and strategy, and generated models (a
random DAG of einsums, element-wise ops, transposes and reductions with
random annotations on a 2-D mesh), the ops are written in several random
topological orders; `spmd partition --json` of each must give every named
value (names without '%': the model's own) the same sharding, and the same
collectives (kind, axes, bytes; the value too when it is the model's own).
A model that fails to partition must fail alike in every order.
"""
import json, os, random, subprocess, sys

import yaml

SPMD, SRC, TMP = sys.argv[1], sys.argv[2], sys.argv[3]
# The sanitizer build (SPMD_SANITIZED=1) looks for memory errors, not for
# order dependence, which the release build's whole sweep covers: there one
# shuffled order a model and fewer generated models.
SANITIZED = os.environ.get("SPMD_SANITIZED") == "1"
SHUFFLES = 1 if SANITIZED else 4


def topo_shuffle(ops, rng):
    """A random topological order of ops (each {'out', 'in'}): indices."""
    made = {o["out"]: i for i, o in enumerate(ops)}
    deps = [{made[x] for x in o.get("in", []) if isinstance(x, str) and x in made} for o in ops]
    users = [[] for _ in ops]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    need = [len(d) for d in deps]
    ready = [i for i in range(len(ops)) if need[i] == 0]
    order = []
    while ready:
        i = ready.pop(rng.randrange(len(ready)))
        order.append(i)
        for u in users[i]:
            need[u] -= 1
            if need[u] == 0:
                ready.append(u)
    assert len(order) == len(ops)
    return order


def reorder_text(text, rng):
    """The model text with its op lines (one `  - {...}` line per op) in a
    random topological order; everything else verbatim."""
    model = yaml.safe_load(text)
    lines = text.split("\n")
    start = lines.index("ops:")
    idx = [k for k in range(start + 1, len(lines)) if lines[k].startswith("  - {")]
    end = start + 1
    while end < len(lines) and (lines[end].startswith("  ") or lines[end].strip() == "" or lines[end].startswith("#")):
        end += 1
    assert len(idx) == len(model["ops"]), "one op per line"
    order = topo_shuffle(model["ops"], rng)
    body = [lines[idx[i]] for i in order]
    return "\n".join(lines[: start + 1] + body + lines[end:])


def canon(path):
    p = subprocess.run([SPMD, "partition", path, "--json"], capture_output=True, text=True)
    if p.returncode != 0:
        return ("error", p.returncode)
    j = json.loads(p.stdout)
    vals = {k: (v["sharding"], v["partial"]) for k, v in j["values"].items() if "%" not in k}
    coll = sorted((c["op"], tuple(c["axes"]), c["bytes_per_device"], c["value"] if "%" not in c["value"] else "")
                  for c in j["collectives"])
    return vals, coll


def check(name, text, rng):
    base = os.path.join(TMP, "base.yaml")
    open(base, "w").write(text)
    want = canon(base)
    for k in range(SHUFFLES):
        path = os.path.join(TMP, "shuffled.yaml")
        open(path, "w").write(reorder_text(text, rng))
        got = canon(path)
        if got != want:
            os.replace(path, os.path.join(TMP, "failed.yaml"))
            diff = ""
            if isinstance(got[0], dict) and isinstance(want[0], dict):
                diff = {v: (want[0].get(v), got[0].get(v)) for v in want[0] if want[0].get(v) != got[0].get(v)}
                if not diff:
                    diff = ("collectives", [c for c in want[1] if c not in got[1]], [c for c in got[1] if c not in want[1]])
            print(f"FAIL: {name}: order {k} differs: {str(diff)[:600]}")
            print(reorder_text(text, random.Random(0)) if False else open(os.path.join(TMP, "failed.yaml")).read()[:3000])
            return False
    return True


LETTERS = {"b": 8, "s": 6, "m": 12, "f": 10, "h": 4}
AXES = ["data", "model"]


def spec(letters, rng, p):
    """A random sharding for a tensor with these letters, or None."""
    if rng.random() > p:
        return None
    free = AXES[:]
    rng.shuffle(free)
    out = []
    for _ in letters:
        out.append(free.pop() if free and rng.random() < 0.5 else "null")
    return "[" + ", ".join(out) + "]"


def generate(rng):
    """A random model: inputs and params of 2-3 letters, 6-14 ops."""
    vals = {}
    lines = ["name: generated", "mesh: {data: 2, model: 3}", "inputs:"]
    for i in range(rng.randint(2, 3)):
        ls = "".join(rng.sample(list(LETTERS), rng.randint(2, 3)))
        vals[f"x{i}"] = ls
        sp = spec(ls, rng, 0.6)
        shape = ", ".join(str(LETTERS[c]) for c in ls)
        lines.append(f"  x{i}: {{shape: [{shape}]" + (f", sharding: {sp}" if sp else "") + "}")
    lines.append("params:")
    for i in range(rng.randint(1, 3)):
        ls = "".join(rng.sample(list(LETTERS), 2))
        vals[f"w{i}"] = ls
        sp = spec(ls, rng, 0.5)
        shape = ", ".join(str(LETTERS[c]) for c in ls)
        lines.append(f"  w{i}: {{shape: [{shape}]" + (f", sharding: {sp}" if sp else "") + "}")
    lines.append("ops:")
    used = set()
    for i in range(rng.randint(6, 14)):
        names = list(vals)
        kind = rng.choice(["einsum", "einsum", "unary", "binary", "transpose", "reduce"])
        a = rng.choice(names)
        la = vals[a]
        out = f"t{i}"
        if kind == "einsum":
            b = rng.choice(names)
            lb = vals[b]
            union = sorted(set(la) | set(lb))
            lo = "".join(rng.sample(union, rng.randint(1, min(3, len(union)))))
            op = f'op: einsum, in: [{a}, {b}], eq: "{la},{lb}->{lo}"'
            used |= {a, b}
        elif kind == "unary":
            lo = la
            op = f"op: {rng.choice(['gelu', 'tanh', 'neg', 'exp'])}, in: [{a}]"
            used.add(a)
        elif kind == "binary":
            same = [n for n in names if vals[n] == la]
            b = rng.choice(same)
            lo = la
            op = f"op: {rng.choice(['add', 'mul', 'sub'])}, in: [{a}, {b}]"
            used |= {a, b}
        elif kind == "transpose":
            perm = list(range(len(la)))
            rng.shuffle(perm)
            lo = "".join(la[p] for p in perm)
            op = f"op: transpose, in: [{a}], perm: {perm}"
            used.add(a)
        else:
            if len(la) < 2:
                continue
            k = rng.randrange(len(la))
            lo = la[:k] + la[k + 1:]
            op = f"op: reduce_sum, in: [{a}], axes: [{k}]"
            used.add(a)
        sp = spec(lo, rng, 0.2)
        vals[out] = lo
        lines.append(f"  - {{out: {out}, {op}" + (f", sharding: {sp}" if sp else "") + "}")
    outs = [n for n in vals if n.startswith("t") and n not in used] or [f"t{i}"]
    lines.append(f"outputs: [{', '.join(outs)}]")
    return "\n".join(lines) + "\n"


def main():
    rng = random.Random(int(os.environ.get("ORDER_TEST_SEED", "5")))
    ok = bad = 0
    models = [os.path.join(SRC, "examples", f) for f in sorted(os.listdir(os.path.join(SRC, "examples")))]
    models += [os.path.join(SRC, "tests", "models", f) for f in sorted(os.listdir(os.path.join(SRC, "tests", "models")))
               if f.startswith("part_")]
    models += [os.path.join(SRC, "tests", d, f) for d in ("pending", "shared", "shardy", "strategy")
               for f in sorted(os.listdir(os.path.join(SRC, "tests", d)))
               if "\nops:\n" in open(os.path.join(SRC, "tests", d, f)).read()]  # models with a block of ops
    for m in models:
        if not m.endswith(".yaml"):
            continue
        if check(os.path.relpath(m, SRC), open(m).read(), rng):
            ok += 1
        else:
            bad += 1
    for k in range(int(os.environ.get("ORDER_TEST_MODELS", "10" if SANITIZED else "60"))):
        text = generate(rng)
        if check(f"generated model {k}", text, rng):
            ok += 1
        else:
            bad += 1
    print(f"order_test: {ok} passed, {bad} failed")
    sys.exit(1 if bad else 0)


main()
