#!/bin/sh
# optimum.sh [SPMD]: the bytes each device hands to collectives in the
# programs spmd emits, against the analytic optimum, for standard patterns
# (models in bench/optimum/).  Prints one row per pattern: emitted bytes,
# optimum bytes, their ratio (1.00: the partitioner sends what a careful
# engineer would).  The optimum is computed here from the model's shapes,
# shardings and mesh, by the formula given in each row's comment.  Not a
# test: docs/performance.md records its output.
SPMD=${1:-build/spmd}
DIR=$(dirname "$0")/optimum
PY=/usr/bin/python3
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$PY" - "$SPMD" "$DIR" "$T" <<'PY'
import json, math, os, subprocess, sys
import yaml

spmd, src, tmp = sys.argv[1:4]


def load(name):
    return yaml.safe_load(open(os.path.join(src, name)))


def variant(name, mesh=None, train=None, drop_train=False, annotate=None):
    """The model file with another mesh, extra train keys, no train section,
    or an annotation added to one op (annotate: (out, sharding))."""
    m = load(name)
    if mesh:
        m["mesh"] = mesh
    if drop_train:
        m.pop("train", None)
    if train:
        m["train"].update(train)
    if annotate:
        for op in m["ops"]:
            if op["out"] == annotate[0]:
                op["sharding"] = annotate[1]
    path = os.path.join(tmp, f"m{len(os.listdir(tmp))}.yaml")
    text = yaml.safe_dump(m, default_flow_style=None, sort_keys=False)
    open(path, "w").write(text.replace("'on'", "on").replace("'off'", "off"))
    return m, path


def emitted(path):
    p = subprocess.run([spmd, "partition", path, "--json"], capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"{path}: {p.stderr.strip()}")
    return json.loads(p.stdout)["total_bytes_per_device"]


def shards(m, spec, d):
    axes = spec[d] if spec and d < len(spec) else None
    axes = [] if axes is None else [axes] if isinstance(axes, str) else axes
    return math.prod(m["mesh"][a] for a in axes)


def local_bytes(m, t):
    """Bytes of one device's shard of the tensor declared as t (4-byte elements)."""
    return 4 * math.prod(-(-n // shards(m, t.get("sharding"), d)) for d, n in enumerate(t["shape"]))


def value_bytes(m, shape, spec):
    return local_bytes(m, {"shape": shape, "sharding": spec})


def params(m):
    return sum(local_bytes(m, t) for t in m["params"].values())


LOSS = 4  # the loss, a mean over the batch split on data: one scalar all_reduce
rows = []


def row(name, path, optimum):
    e = emitted(path)
    rows.append((name, e, optimum, e / optimum))


# Megatron MLP: forward, one all_reduce of y's shard over model;
# training adds the gradients' all_reduce over data (each param's shard).
m, p = variant("mlp.yaml", drop_train=True)
y = value_bytes(m, m["inputs"]["x"]["shape"], ["data", None])
row("Megatron MLP, forward", p, y + LOSS)
m, p = variant("mlp.yaml")
row("Megatron MLP, training", p, y + params(m) + LOSS)
# Megatron attention: one all_reduce of the output's shard; training adds
# the gradients (x is an input: no input gradient).
m, p = variant("attention.yaml", drop_train=True)
y = value_bytes(m, m["inputs"]["x"]["shape"], ["data", None, None])
row("Megatron attention, forward", p, y + LOSS)
m, p = variant("attention.yaml")
row("Megatron attention, training", p, y + params(m) + LOSS)
# Sequence parallelism: all_gather of x's shard (split on the sequence),
# reduce_scatter of the MLP's output (the whole [b/data, s, d] buffer).
for label, ann in (("as written", None), ("a annotated [data, null, model]", ("a", ["data", None, "model"]))):
    m, p = variant("seqpar.yaml", annotate=ann)
    x = m["inputs"]["x"]
    row(f"sequence parallel, {label}", p, local_bytes(m, x) + value_bytes(m, x["shape"], ["data", None, None]))
# Sequence parallelism around Megatron attention: one all_gather of the
# norm's shard (the query, key and value projections all read it gathered)
# and the reduce_scatter of the output projection's sums.
m, p = variant("seqpar_attn.yaml")
x = m["inputs"]["x"]
row("sequence parallel attention (q, k, v: one gather)", p,
    local_bytes(m, x) + value_bytes(m, x["shape"], ["data", None, None]))
# Pure data parallelism on 8 devices: the gradients' all_reduce; with
# weight-update sharding a reduce_scatter of them and an all_gather of the
# new weights (1/8 of their bytes).
mesh = {"data": 8, "model": 1}
m, p = variant("mlp.yaml", mesh=mesh)
row("data parallelism, 8 devices", p, params(m) + LOSS)
m, p = variant("mlp.yaml", mesh=mesh, train={"weight_update_sharding": "on"})
row("data parallelism + weight-update sharding", p, params(m) + params(m) // 8 + LOSS)
# PaLM parallel block: forward, one all_reduce of y (both branches);
# training, one more for the gradient of ln(x) (q, k, v and MLP input),
# and the gradients' all_reduce over data.
m, p = variant("palm.yaml", drop_train=True)
y = value_bytes(m, m["inputs"]["x0"]["shape"], ["data", None, None])
row("PaLM parallel block, forward", p, y + LOSS)
m, p = variant("palm.yaml")
row("PaLM parallel block, training", p, 2 * y + params(m) + LOSS)
# Spatial partitioning: a 3x3 same convolution with rows split sends one
# halo row [b, 1, w, c] each way.
m, p = variant("convnet.yaml")
b, h, w, c = m["inputs"]["images"]["shape"]
row("conv net, rows split (halo exchange)", p, 2 * 4 * b * w * c)

# Megatron block with input gradients (tests/pending/megatron_block.yaml):
# 2 all_reduces over model forward, 2 backward, then the gradients.
m, p = variant("../../tests/pending/megatron_block.yaml")
y = value_bytes(m, m["inputs"]["x0"]["shape"], ["data", None, None])
row("Megatron block, training (input gradients)", p, 4 * y + params(m) + LOSS)
# Mixture of experts: the expert buffer [e, g, c, d] moves from split on the
# groups to split on the experts (dispatch) and back (combine): two
# all_to_alls of one shard.
m, p = variant("moe.yaml")
g, s_, e, c = m["inputs"]["dispatch"]["shape"]
d = m["inputs"]["x"]["shape"][2]
row("MoE layer, all_to_all dispatch and combine", p, 2 * value_bytes(m, [e, g, c, d], ["data", None, None, None]))
# 2-D weight sharding: each weight's shard gathered over data before use,
# and the Megatron all_reduce of y.
m, p = variant("weight2d.yaml")
y = value_bytes(m, m["inputs"]["x"]["shape"], ["data", None])
row("2-D weight sharding (gather over data + Megatron)", p, params(m) + y)

print(f"{'pattern':52} {'emitted B':>10} {'optimum B':>10} {'ratio':>6}")
for name, e, o, r in rows:
    print(f"{name:52} {e:10d} {o:10d} {r:6.2f}")
PY
