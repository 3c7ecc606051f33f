#!/bin/sh
# make_pictures.sh: draw the pictures in docs/pictures/ that README.md and docs/pictures.md show.
# usage: sh scripts/make_pictures.sh [SPMD_BINARY]   (default build/spmd; run from anywhere)
# Every file in docs/pictures/ comes from here; none is drawn by hand.  The
# report's screenshot needs chromium (scripts/setup.sh installs it).
set -e
cd "$(dirname "$0")/.."
SPMD=${1:-build/spmd}
out=docs/pictures
mkdir -p "$out"
# tile maps: an uneven partial sum (before the all_reduce), and a rank-4 value as slices
NO_COLOR=1 "$SPMD" show examples/mlp.yaml 'y%local' --mesh data=3,model=2 --svg "$out/tilemap_partial.svg" \
	>"$out/tilemap_partial.txt"
"$SPMD" show examples/transformer_block.yaml q --mesh data=2,model=2 --svg "$out/tilemap_rank4.svg" >/dev/null
# a reshard plan: the layouts it goes through
"$SPMD" reshard --mesh data=2,model=4 --shape 8,16 --from '[[data, model], null]' --to '[model, data]' \
	--svg "$out/reshard.svg" >/dev/null
# the cost model's schedule of the training step, every device, with memory
"$SPMD" cost examples/train_mlp.yaml --trace "$out/train_mlp_trace.json" >/dev/null
# the report, and what a browser shows of its top
"$SPMD" report examples/mlp.yaml -o "$out/report_mlp.html"
if command -v chromium >/dev/null 2>&1; then
	profile=$(mktemp -d)
	chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
		--disable-component-update --disable-sync --user-data-dir="$profile" --window-size=1200,1500 \
		--screenshot="$PWD/$out/report_mlp.png" "file://$PWD/$out/report_mlp.html" >/dev/null 2>&1
	rm -rf "$profile"
else
	echo "make_pictures: chromium is not installed: $out/report_mlp.png not redrawn" >&2
fi
echo "make_pictures: drew $(ls "$out" | wc -l) files in $out"
