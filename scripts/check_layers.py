#!/usr/bin/env python3
"""check_layers.py: every #include of the sources goes down the layers.

    python3 scripts/check_layers.py [ROOT]      # check the tree (default: .)
    python3 scripts/check_layers.py --self-test # the rule rejects known back edges

The layers, lowest floor first.  A folder may include its own files and the
files of folders on lower floors; a folder on a higher floor, or a neighbour
on the same floor, is a back edge.  This list is the one place the order is
written (docs/design.md draws it; CMakeLists.txt links one library per
layer in the same order).  An include that names no file of the tree
(<system> headers, or a path that does not resolve) is an error too, so a
moved file cannot leave a stale include behind.
"""
import os
import re
import sys

FLOORS = [
    ["base"],
    ["mesh"],
    ["sharding_spec"],
    ["spmd"],
    ["runtime", "cost_model", "train"],
    ["partitioner"],
    ["cli"],
]
FLOOR = {folder: i for i, floor in enumerate(FLOORS) for folder in floor}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def allowed(src, dst):
    """True if a file of folder src may include a file of folder dst."""
    return src == dst or FLOOR[dst] < FLOOR[src]


def rule(src, dst):
    if FLOOR[dst] == FLOOR[src]:
        return "%s/ and %s/ are neighbours on one floor" % (src, dst)
    return "%s/ is above %s/" % (dst, src)


def check_file(root, path, lines):
    """Problems of one file (path relative to root) given its lines."""
    src = path.split("/")[0]
    out = []
    for no, line in enumerate(lines, 1):
        m = INCLUDE.match(line)
        if not m:
            continue
        target = os.path.normpath(os.path.join(os.path.dirname(path), m.group(1)))
        dst = target.split("/")[0]
        where = "%s:%d" % (path, no)
        if target.startswith("..") or dst not in FLOOR:
            out.append("%s: error: expected an include of a file in a layer folder, found \"%s\"" % (where, m.group(1)))
        elif root is not None and not os.path.exists(os.path.join(root, target)):
            out.append("%s: error: expected an include of an existing file, found \"%s\"" % (where, m.group(1)))
        elif not allowed(src, dst):
            out.append("%s: error: expected includes of %s or a lower layer, found %s (%s)"
                       % (where, src + "/", target, rule(src, dst)))
    return out


def check_tree(root):
    problems, nfiles = [], 0
    for folder in FLOOR:
        d = os.path.join(root, folder)
        if not os.path.isdir(d):
            problems.append("%s/: error: expected the layer folder, found nothing" % folder)
            continue
        for name in sorted(os.listdir(d)):
            if not name.endswith((".c", ".h", ".def")):
                continue
            path = folder + "/" + name
            with open(os.path.join(root, path), encoding="utf-8") as f:
                problems += check_file(root, path, f.read().splitlines())
            nfiles += 1
    return problems, nfiles


# Back edges the layout removed: each must be rejected.
BACK_EDGES = [
    ("spmd/ops.h", '#include "../runtime/tensor.h"'),
    ("spmd/npy.h", '#include "../runtime/kernels.h"'),
    ("spmd/emit.c", '#include "../runtime/collectives.h"'),
    ("spmd/load.c", '#include "../train/train.h"'),
    ("cost_model/measure.c", '#include "../partitioner/pipeline.h"'),
    ("cost_model/measure.c", '#include "../runtime/exec.h"'),
    ("cost_model/collective_cost.c", '#include "../runtime/collectives.h"'),
    ("train/train.c", '#include "../partitioner/part.h"'),
    ("partitioner/propagate.c", '#include "../cli/cli.h"'),
    ("sharding_spec/reshard.c", '#include "../spmd/ops.h"'),
    ("mesh/mesh.h", '#include "../spmd/base.h"'),
    ("mesh/mesh.h", '#include "../spmd/ir.h"'),
    ("runtime/exec.c", '#include "../cost_model/cost.h"'),
    ("base/base.c", '#include "../../elsewhere/x.h"'),
]
GOOD_EDGES = [
    ("spmd/ops.h", '#include "ir.h"'),
    ("runtime/kernels.h", '#include "../spmd/ops.h"'),
    ("partitioner/part.h", '#include "../cost_model/cost.h"'),
    ("cli/main.c", '#include "../partitioner/pipeline.h"'),
    ("mesh/mesh.h", '#include "../base/base.h"'),
]


def self_test():
    bad = 0
    for path, line in BACK_EDGES:
        if not check_file(None, path, [line]):
            print("check_layers: self-test: %s: %s was accepted" % (path, line))
            bad += 1
    for path, line in GOOD_EDGES:
        if check_file(None, path, [line]):
            print("check_layers: self-test: %s: %s was rejected" % (path, line))
            bad += 1
    n = len(BACK_EDGES) + len(GOOD_EDGES)
    print("check_layers: self-test: %d passed, %d failed" % (n - bad, bad))
    return 1 if bad else 0


def main(argv):
    if len(argv) > 1 and argv[1] == "--self-test":
        return self_test()
    root = argv[1] if len(argv) > 1 else "."
    problems, nfiles = check_tree(root)
    for p in problems:
        print(p)
    print("check_layers: %d files, %d back edges" % (nfiles, len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
