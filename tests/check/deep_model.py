#!/usr/bin/env python3
"""deep_model.py: print a deep training model for --check's tests.

Usage: python3 tests/check/deep_model.py LAYERS OPTIMIZER DTYPE [MESH]

LAYERS pre-LN transformer blocks (attention with a bias on the scores that
is constant along the softmax axis, so its gradient is zero by symmetry and
both sides hold only rounding noise; then an MLP), a projection to the
vocabulary and softmax_cross_entropy.  OPTIMIZER: sgd, momentum, adam,
adamw or lamb.  DTYPE: f32 or bf16 (the params and activations; updates
are f32 as always).  Batch over `data`, heads and the MLP over `model`."""
import sys

layers, opt, dtype = int(sys.argv[1]), sys.argv[2], sys.argv[3]
mesh = sys.argv[4] if len(sys.argv) > 4 else "{data: 2, model: 2}"
B, S, M, H, D, F, V = 4, 8, 16, 2, 8, 32, 12
out = [f"name: deep_{opt}_{dtype}_{layers}", f"mesh: {mesh}", "inputs:",
       f"  tokens: {{shape: [{B}, {S}], dtype: i32, sharding: [data, null]}}",
       f"  labels: {{shape: [{B}, {S}], dtype: i32, sharding: [data, null]}}", "params:",
       f"  embed: {{shape: [{V}, {M}], dtype: {dtype}, init: {{normal: 0.5}}}}",
       f"  wout: {{shape: [{M}, {V}], dtype: {dtype}, init: {{normal: 0.2}}}}"]
ops = ["  - {out: x0, op: take, in: [embed, tokens], sharding: [data, null, null]}"]
for i in range(layers):
    p = lambda n, shape, init, sh=None: out.append(
        f"  {n}{i}: {{shape: {shape}, dtype: {dtype}" + (f", sharding: {sh}" if sh else "") + f", init: {init}}}")
    p("ln_s", f"[{M}]", "ones")
    p("ln_b", f"[{M}]", "zeros")
    for w in "qkv":
        p("w" + w, f"[{M}, {H}, {D}]", "{normal: 0.2}", "[null, model, null]")
    p("sbias", f"[{H}, {S}, 1]", "{normal: 0.1}", "[model, null, null]")
    p("wo", f"[{H}, {D}, {M}]", "{normal: 0.2}", "[model, null, null]")
    p("w1", f"[{M}, {F}]", "{normal: 0.2}", "[null, model]")
    p("b1", f"[{F}]", "zeros", "[model]")
    p("w2", f"[{F}, {M}]", "{normal: 0.2}", "[model, null]")
    x, y = f"x{i}", f"x{i + 1}"
    ops += [f"  - {{out: n{i}, op: layer_norm, in: [{x}]}}",
            f"  - {{out: ns{i}, op: mul, in: [n{i}, ln_s{i}]}}",
            f"  - {{out: h{i}, op: add, in: [ns{i}, ln_b{i}]}}"]
    for w in "qkv":
        ops.append(f"  - {{out: {w}{i}, op: einsum, in: [h{i}, w{w}{i}], eq: \"bsm,mhd->bshd\", "
                   "sharding: [data, null, model, null]}")
    ops += [f"  - {{out: sc{i}, op: einsum, in: [q{i}, k{i}], eq: \"bqhd,bkhd->bhqk\"}}",
            f"  - {{out: ss{i}, op: mul, in: [sc{i}, 0.35355339]}}",
            f"  - {{out: sa{i}, op: add, in: [ss{i}, sbias{i}]}}",
            f"  - {{out: pr{i}, op: softmax, in: [sa{i}], axis: -1}}",
            f"  - {{out: c{i}, op: einsum, in: [pr{i}, v{i}], eq: \"bhqk,bkhd->bqhd\", "
            "sharding: [data, null, model, null]}",
            f"  - {{out: at{i}, op: einsum, in: [c{i}, wo{i}], eq: \"bqhd,hdm->bqm\"}}",
            f"  - {{out: r{i}, op: add, in: [{x}, at{i}], sharding: [data, null, null]}}",
            f"  - {{out: f{i}, op: einsum, in: [r{i}, w1{i}], eq: \"bsm,mf->bsf\", sharding: [data, null, model]}}",
            f"  - {{out: fb{i}, op: add, in: [f{i}, b1{i}]}}",
            f"  - {{out: g{i}, op: gelu, in: [fb{i}]}}",
            f"  - {{out: o{i}, op: einsum, in: [g{i}, w2{i}], eq: \"bsf,fm->bsm\"}}",
            f"  - {{out: {y}, op: add, in: [r{i}, o{i}], sharding: [data, null, null]}}"]
ops += [f"  - {{out: logits, op: einsum, in: [x{layers}, wout], eq: \"bsm,mv->bsv\"}}",
        "  - {out: loss, op: softmax_cross_entropy, in: [logits, labels]}"]
lr = {"sgd": 0.02, "momentum": 0.01}.get(opt, 0.01)
wd = ", weight_decay: 0.01" if opt in ("adamw", "lamb") else ""
print("\n".join(out + ["ops:"] + ops + ["outputs: [loss]", "train:", "  loss: loss",
                                        f"  optimizer: {{type: {opt}, lr: {lr}{wd}}}", "  steps: 5"]))
