#!/usr/bin/python3
"""numpy_ref.py: an independent numpy interpreter of the spmd model format (docs/format.md).

It shares no code with spmd: it reads the model with PyYAML, runs every op of
the version 1 op set with numpy (in float64, rounding each result to its
declared dtype as spmd stores it), and compares with what `spmd run --save`
wrote.

  numpy_ref.py gen   MODEL.yaml INDIR [--seed N]   write INDIR/NAME.npy for every
                                                   input and param; print the
                                                   matching `--input NAME=FILE` args
  numpy_ref.py check MODEL.yaml INDIR OUTDIR       compute the outputs from INDIR,
                                                   compare with OUTDIR/NAME.npy
  numpy_ref.py eval  MODEL.yaml INDIR OUTDIR       compute the outputs, save them

Exit status: 0 ok, 1 a mismatch, 2 bad usage or an unreadable model,
3 the model uses something this reference does not implement.
"""
import math
import os
import re
import sys

import numpy as np
import yaml

RTOL = {"f32": 1e-4, "f64": 1e-4, "bf16": 2.0 ** -6, "f16": 2.0 ** -9, "i32": 0.0}
ATOL = {"f32": 1e-5, "f64": 1e-5, "bf16": 2.0 ** -7, "f16": 2.0 ** -10, "i32": 0.0}
SAVED = {"f32": "<f4", "bf16": "<f4", "f16": "<f4", "f64": "<f8", "i32": "<i4"}


class Unsupported(Exception):
    """The model uses a feature this reference does not implement."""


# ---- YAML as the format reads it (YAML 1.2 core scalars) ----

class Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core resolution: `1e-05` is a number,
    `yes`/`on` are strings, booleans are true/false/True/False/TRUE/FALSE."""


Loader.yaml_implicit_resolvers = {}
Loader.add_implicit_resolver(
    "tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""])
Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
    list("-+0123456789"))
Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def construct_int(loader, node):
    s = loader.construct_scalar(node)
    if s.startswith("0o"):
        return int(s[2:], 8)
    if s.startswith("0x"):
        return int(s[2:], 16)
    return int(s, 10)


def construct_float(loader, node):
    s = loader.construct_scalar(node).lower()
    if s.endswith(".inf"):
        return -math.inf if s.startswith("-") else math.inf
    if s == ".nan":
        return math.nan
    return float(s)


def construct_bool(loader, node):
    return loader.construct_scalar(node).lower() == "true"


Loader.add_constructor("tag:yaml.org,2002:int", construct_int)
Loader.add_constructor("tag:yaml.org,2002:float", construct_float)
Loader.add_constructor("tag:yaml.org,2002:bool", construct_bool)


def load_model(path):
    with open(path) as f:
        m = yaml.load(f, Loader=Loader)
    if not isinstance(m, dict) or "inputs" not in m or "ops" not in m or "outputs" not in m:
        raise Unsupported("not a version 1 model (inputs, ops, outputs)")
    for key in m:
        if key not in ("name", "mesh", "axis_rules", "inputs", "params", "ops", "outputs"):
            raise Unsupported("top-level key %r" % key)
    for op in m["ops"]:
        if op.get("op") not in KNOWN_OPS:
            raise Unsupported("op %r" % op.get("op"))
    return m


def tensors(m):
    """(name, decl, is_param) for every input and param, in file order."""
    out = [(n, d, False) for n, d in (m.get("inputs") or {}).items()]
    return out + [(n, d, True) for n, d in (m.get("params") or {}).items()]


# ---- dtypes: values are float64 (floats) or int64 (i32) arrays ----

def round_bf16(x):
    f = np.ascontiguousarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(f), f, r).astype(np.float64)


def to_dtype(x, dt):
    """Round or convert x to how spmd stores a value of dtype dt."""
    x = np.asarray(x)
    if dt == "i32":
        if x.dtype.kind == "f":
            with np.errstate(invalid="ignore"):
                x = np.trunc(x)
        return x.astype(np.int64).astype(np.int32).astype(np.int64)
    x = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if dt == "f32":
            return x.astype(np.float32).astype(np.float64)
        if dt == "bf16":
            return round_bf16(x.astype(np.float32))
        if dt == "f16":
            return x.astype(np.float32).astype(np.float16).astype(np.float64)
    if dt == "f64":
        return x
    raise Unsupported("dtype %r" % dt)


# ---- ops ----

def gelu(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


UNARY = {
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x), "tanh": np.tanh,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)), "relu": lambda x: np.maximum(x, 0.0),
    "gelu": gelu, "square": np.square, "reciprocal": lambda x: 1.0 / x,
}
BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "max": np.maximum, "min": np.minimum, "pow": np.power,
}


def axis_of(op, rank, key="axis", default=-1):
    a = op.get(key, default)
    return a + rank if a < 0 else a


def reduce_op(op, x):
    axes = op.get("axes")
    axes = tuple(range(x.ndim)) if axes is None else tuple(a % x.ndim for a in axes)
    keep = bool(op.get("keepdims", False))
    fn = {"reduce_sum": np.sum, "reduce_max": np.max, "reduce_mean": np.mean}[op["op"]]
    return fn(x, axis=axes, keepdims=keep)


def softmax(op, x):
    a = axis_of(op, x.ndim)
    z = x - np.max(x, axis=a, keepdims=True)
    e = np.exp(z)
    if op["op"] == "softmax":
        return e / np.sum(e, axis=a, keepdims=True)
    return z - np.log(np.sum(e, axis=a, keepdims=True))


def layer_norm(op, x):
    a = axis_of(op, x.ndim)
    mean = np.mean(x, axis=a, keepdims=True)
    var = np.mean((x - mean) ** 2, axis=a, keepdims=True)
    return (x - mean) / np.sqrt(var + float(op.get("eps", 1e-5)))


def slice_op(op, x):
    start, limit = op["start"], op["limit"]
    stride = op.get("stride", [1] * x.ndim)
    for d in range(x.ndim):
        if not (0 <= start[d] <= limit[d] <= x.shape[d]) or stride[d] < 1:
            raise ValueError("slice out of range in dim %d" % d)
    return x[tuple(slice(s, l, t) for s, l, t in zip(start, limit, stride))]


def conv_padding(op, h, w, kh, kw):
    """[[top, bottom], [left, right]] and the strides, by the rules of docs/format.md."""
    sh, sw = op.get("strides", [1, 1])
    mode = op.get("padding", "valid")
    if mode == "valid":
        return [[0, 0], [0, 0]], sh, sw
    if mode == "same":
        pads = []
        for n, k, s in ((h, kh, sh), (w, kw, sw)):
            total = max((-(-n // s) - 1) * s + k - n, 0)
            pads.append([total // 2, total - total // 2])
        return pads, sh, sw
    return [list(p) for p in mode], sh, sw


def conv2d(op, x, k):
    """NHWC input, HWIO kernel, cross-correlation: one strided window per kernel tap."""
    n, h, w, c = x.shape
    kh, kw, kc, o = k.shape
    assert kc == c
    ((pt, pb), (pl, pr)), sh, sw = conv_padding(op, h, w, kh, kw)
    xp = np.pad(x, [(0, 0), (pt, pb), (pl, pr), (0, 0)])
    oh = (h + pt + pb - kh) // sh + 1
    ow = (w + pl + pr - kw) // sw + 1
    out = np.zeros((n, oh, ow, o))
    for i in range(kh):
        for j in range(kw):
            win = xp[:, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw, :]
            out += np.einsum("nhwc,co->nhwo", win, k[i, j])
    return out


def take(table, ids):
    if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
        raise ValueError("take: id out of range")
    return table[ids]


def one_hot(op, ids):
    return (ids[..., None] == np.arange(int(op["depth"]))).astype(np.float64)


KNOWN_OPS = set(UNARY) | set(BINARY) | {
    "einsum", "reduce_sum", "reduce_max", "reduce_mean", "softmax", "log_softmax",
    "layer_norm", "transpose", "reshape", "broadcast_to", "slice", "concat", "pad",
    "conv2d", "take", "one_hot", "cast", "copy"}


def run_op(op, args):
    """The result of one op from its operand arrays."""
    kind = op["op"]
    x = args[0]
    if kind in UNARY:
        return UNARY[kind](x)
    if kind in BINARY:
        if kind == "div" and x.dtype.kind == "i":
            raise Unsupported("integer div")
        return BINARY[kind](x, args[1])
    if kind == "einsum":
        return np.einsum(op["eq"], *args)
    if kind.startswith("reduce_"):
        return reduce_op(op, x)
    if kind in ("softmax", "log_softmax"):
        return softmax(op, x)
    if kind == "layer_norm":
        return layer_norm(op, x)
    if kind == "transpose":
        return np.transpose(x, op.get("perm"))
    if kind == "reshape":
        return np.reshape(x, op["shape"])
    if kind == "broadcast_to":
        return np.broadcast_to(x, op["shape"]).copy()
    if kind == "slice":
        return slice_op(op, x)
    if kind == "concat":
        return np.concatenate(args, axis=op["axis"])
    if kind == "pad":
        return np.pad(x, list(zip(op["low"], op["high"])), constant_values=op.get("value", 0))
    if kind == "conv2d":
        return conv2d(op, x, args[1])
    if kind == "take":
        return take(x, args[1])
    if kind == "one_hot":
        return one_hot(op, x)
    if kind in ("cast", "copy"):
        return x.copy()
    raise Unsupported("op %r" % kind)


def result_dtype(op, dts):
    if op["op"] == "one_hot":
        return "f32"
    if op["op"] == "cast":
        return op["dtype"]
    return dts[0]


def operands(op, env):
    """Operand arrays and dtypes; a number takes the dtype of the tensor beside
    it (f32 when there is none)."""
    names = op.get("in") or []
    dts = [env[n][1] for n in names if isinstance(n, str)] or ["f32"]
    args, adts = [], []
    for n in names:
        if isinstance(n, str):
            args.append(env[n][0])
            adts.append(env[n][1])
        else:
            args.append(to_dtype(np.array(float(n)), dts[0]))
            adts.append(dts[0])
    return args, adts


def evaluate(m, indir):
    """{output name: (array, dtype)} computed from INDIR/NAME.npy."""
    env = {}
    for name, decl, _ in tensors(m):
        dt = decl.get("dtype", "f32")
        a = np.load(os.path.join(indir, name + ".npy"))
        env[name] = (to_dtype(a, dt), dt)
    for op in m["ops"]:
        args, dts = operands(op, env)
        dt = result_dtype(op, dts)
        with np.errstate(all="ignore"):
            env[op["out"]] = (to_dtype(run_op(op, args), dt), dt)
    return {n: env[n] for n in m["outputs"]}


# ---- test data ----

def id_bound(m, name):
    """(lo, hi) for generated ids of i32 input `name`: valid for every take and
    one_hot reading it; ids read only by one_hot include one out-of-range
    value on each side; other i32 tensors get small integers."""
    decls = {n: d for n, d, _ in tensors(m)}
    hi, only_one_hot = None, True
    for op in m["ops"]:
        ins = op.get("in") or []
        if op["op"] == "take" and len(ins) == 2 and ins[1] == name:
            hi = min(hi or 1 << 30, decls[ins[0]]["shape"][0])
            only_one_hot = False
        elif op["op"] == "one_hot" and ins == [name]:
            hi = min(hi or 1 << 30, int(op["depth"]))
    if hi is None:
        return -50, 50
    return (-1, hi + 1) if only_one_hot else (0, hi)


def gen_tensor(rng, m, name, decl, is_param):
    shape = tuple(decl.get("shape", []))
    dt = decl.get("dtype", "f32")
    if dt == "i32":
        lo, hi = id_bound(m, name)
        return rng.integers(lo, hi, size=shape).astype("<i4")
    init = decl.get("init", {"normal": 0.02}) if is_param else {"normal": 1.0}
    if isinstance(init, dict) and "uniform" in init:
        lo, hi = init["uniform"]
        a = rng.uniform(lo, hi, size=shape)
    elif isinstance(init, dict) and "normal" in init:
        a = rng.normal(0.0, float(init["normal"]) or 1.0, size=shape)
    else:  # zeros and ones: random around them, so that the ops using them are tested
        a = (1.0 if init == "ones" else 0.0) + rng.normal(0.0, 0.1, size=shape)
    return np.asarray(a).astype("<f8" if dt == "f64" else "<f4")


def cmd_gen(model, indir, seed):
    m = load_model(model)
    rng = np.random.default_rng(seed)
    os.makedirs(indir, exist_ok=True)
    for name, decl, is_param in tensors(m):
        path = os.path.join(indir, name + ".npy")
        np.save(path, gen_tensor(rng, m, name, decl, is_param))
        print("--input %s=%s" % (name, path))
    return 0


# ---- comparison ----

def compare(name, ref, dt, got):
    """Messages describing how `got` (as saved by spmd) differs from `ref`.
    Outputs named exact_* (single correctly rounded ops) must match bit for bit."""
    rtol, atol = (0.0, 0.0) if name.startswith("exact_") else (RTOL[dt], ATOL[dt])
    if got.dtype.str != SAVED[dt]:
        return ["%s: saved as %s, expected %s" % (name, got.dtype.str, SAVED[dt])]
    if got.shape != ref.shape:
        return ["%s: shape %s, expected %s" % (name, got.shape, ref.shape)]
    got = got.astype(np.float64)
    same = (got == ref) | (np.isnan(got) & np.isnan(ref))
    finite = np.abs(ref[np.isfinite(ref)])
    scale = max(float(finite.max()) if finite.size else 0.0, 1e-30)
    with np.errstate(invalid="ignore"):
        err = np.abs(got - ref)
        ok = same | (err <= rtol * np.abs(ref) + atol * scale)
    if ok.all():
        return []
    i = np.unravel_index(np.argmax(np.where(ok, 0, np.nan_to_num(err, nan=np.inf) + 1)), ref.shape)
    return ["%s: %d of %d elements differ; worst at %s: spmd %r, numpy %r (max |numpy| %g)"
            % (name, int((~ok).sum()), ok.size, tuple(int(k) for k in i),
               float(got[i]), float(ref[i]), scale)]


def cmd_check(model, indir, outdir):
    m = load_model(model)
    errs = []
    for name, (ref, dt) in evaluate(m, indir).items():
        path = os.path.join(outdir, name + ".npy")
        if not os.path.exists(path):
            errs.append("%s: spmd saved no %s" % (name, path))
            continue
        errs += compare(name, ref, dt, np.load(path))
    for e in errs:
        print("numpy_ref: %s: %s" % (model, e))
    return 1 if errs else 0


def cmd_eval(model, indir, outdir):
    m = load_model(model)
    os.makedirs(outdir, exist_ok=True)
    for name, (ref, dt) in evaluate(m, indir).items():
        np.save(os.path.join(outdir, name + ".npy"), ref.astype(SAVED[dt]))
    return 0


def main(argv):
    try:
        if len(argv) in (3, 5) and argv[0] == "gen":
            seed = int(argv[4]) if len(argv) == 5 and argv[3] == "--seed" else 0
            return cmd_gen(argv[1], argv[2], seed)
        if len(argv) == 4 and argv[0] == "check":
            return cmd_check(*argv[1:])
        if len(argv) == 4 and argv[0] == "eval":
            return cmd_eval(*argv[1:])
    except Unsupported as e:
        print("numpy_ref: %s: not implemented here: %s" % (argv[1], e))
        return 3
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
