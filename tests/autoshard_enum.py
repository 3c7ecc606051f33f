#!/usr/bin/env python3
"""autoshard_enum.py SPMD MODEL.yaml HARDWARE BUDGET...: price every sharding
of the model's unannotated params (each mesh axis splits one dim or none,
shard counts dividing the dims) with `spmd cost --json`, once, and print per
BUDGET (a line each, in order) the least overlapped step time of those whose
peak fits in BUDGET bytes (or 'none')."""
import itertools, json, os, re, subprocess, sys, tempfile

import yaml

spmd, path, hw, budgets = sys.argv[1], sys.argv[2], sys.argv[3], [float(b) for b in sys.argv[4:]]
text = open(path).read()
model = yaml.safe_load(text)
axes = list(model["mesh"].items())
free = [(n, p["shape"]) for n, p in model["params"].items() if "sharding" not in p]


def specs(shape):
    for dims in itertools.product(range(-1, len(shape)), repeat=len(axes)):
        split = [[] for _ in shape]
        for (name, size), d in zip(axes, dims):
            if d >= 0 and size > 1:
                split[d].append((name, size))
            elif d >= 0:
                break
        else:
            if all(shape[d] % max(1, eval("*".join(str(s) for _, s in split[d]) or "1")) == 0 for d in range(len(shape))):
                yield "[" + ", ".join("null" if not s else s[0][0] if len(s) == 1 else "[" + ", ".join(a for a, _ in s) + "]" for s in split) + "]"


priced = []  # (step time, peak, plan) of every sharding that partitions
with tempfile.TemporaryDirectory() as tmp:
    for combo in itertools.product(*[list(specs(shape)) for _, shape in free]):
        t = text
        for (name, _), spec in zip(free, combo):
            t = re.sub(r"(\n  %s: \{shape: \[[^]]*\])" % name, r"\1, sharding: %s" % spec, t)
        f = os.path.join(tmp, "m.yaml")
        open(f, "w").write(t)
        out = subprocess.run([spmd, "cost", f, "--hardware", hw, "--json"], capture_output=True, text=True)
        if out.returncode != 0:
            continue
        j = json.loads(out.stdout)
        priced.append((j["step_time_overlapped_s"], j["memory"]["peak_bytes"], combo))
for budget in budgets:
    fit = [p for p in priced if p[1] <= budget]
    best = min(fit, key=lambda p: p[0]) if fit else None
    print("none" if best is None else repr(best[0]))
    print("plan at %g:" % budget, best and best[2], file=sys.stderr)
