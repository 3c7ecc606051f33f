#!/bin/sh
# chunk_test.sh SPMD SOURCE_DIR: long collectives in chunks (partitioner/chunk.h).
# Where the cost model on the mesh's hardware finds a long collective
# holding the links while one the compute stream waits for is ready, and
# the chunks make the step faster, the collective becomes slices, chunk
# collectives and a concat; the program written, priced and run is that
# one, and it computes what the reference does.  Where they would not
# gain, or on the thread backend's profile, the program is left alone and
# the reports say why.
SPMD=$1
SRC=$2
. "$SRC/tests/script_setup.sh"
GEN=$(dirname "$SPMD")/bench/gen_transformer
T=$tmp
PROFILE=$SRC/tests/chunk/links_bound.yaml
. "$SRC/tests/assert_lib.sh"
# model HARDWARE: a 4-layer decoder (d_model 128, vocabulary 8000) trained
# data-parallel on 8 devices with ZeRO-3 (weights gathered before each
# use), its mesh on HARDWARE, into $T/m.yaml
model() {
	"$GEN" 4 8x1 8x1 --dmodel 128 --seq 64 --vocab 8000 --train --plan batch,wus |
		sed -e "s|^mesh: {\([^}]*\)}$|mesh: {axes: {\1}, hardware: $1}|" \
			-e 's/^  weight_update_sharding: on/  weight_update_sharding: on\n  all_gather: before_use/' >"$T/m.yaml"
}

# 1. Taken: faster, priced alike by cost and partition, the program's
# chunks and concat, each chunk saying why.
model "$PROFILE"
rm -f "$T/prog.yaml"
"$SPMD" partition "$T/m.yaml" --json -o "$T/prog.yaml" >"$T/p.json" 2>"$T/err" || bad "partition: $(cat "$T/err")"
"$SPMD" cost "$T/m.yaml" --json >"$T/c.json" 2>"$T/err" || bad "cost: $(cat "$T/err")"
py "chunked: faster, priced alike" \
	"j['chunks']['chunked'] and j['chunks']['hardware'] == 'links_bound'" \
	"j['chunks']['collectives'] >= 1 and j['chunks']['chunks'] >= 2 * j['chunks']['collectives']" \
	"j['chunks']['step_chunked_s'] < 0.999 * j['chunks']['step_s']" \
	"j['chunks']['peak_chunked_bytes'] <= 1.01 * j['chunks']['peak_bytes']" \
	"sorted(c['chunks']) == sorted(j['chunks'])" \
	"all(abs(v - j['chunks'][k]) <= 1e-12 * abs(v) if isinstance(v, float) else v == j['chunks'][k] for k, v in c['chunks'].items())" \
	"abs(c['step_time_overlapped_s'] - j['chunks']['step_chunked_s']) <= 1e-12 * c['step_time_overlapped_s']"
py "chunked: the program's slices, chunks and concat" \
	"sum('chunks, which' in (o.get('why') or '') for o in prog['ops']) == j['chunks']['chunks']" \
	"sum(o['op'] == 'concat' for o in prog['ops']) >= j['chunks']['collectives']" \
	"all(o['op'] in ('all_gather', 'reduce_scatter', 'all_reduce') for o in prog['ops'] if 'chunks, which' in (o.get('why') or ''))"
"$SPMD" partition "$T/m.yaml" >"$T/text" 2>&1 && grep -q "^chunks: [0-9]* collectives* in [0-9]* chunks, which collectives needed sooner run between" "$T/text" && ok ||
	bad "partition: no chunks line: $(tail -3 "$T/text")"
"$SPMD" cost "$T/m.yaml" >"$T/text" 2>&1 && grep -q "^chunks: .* in [0-9]* chunks" "$T/text" && ok ||
	bad "cost: no chunks line: $(tail -3 "$T/text")"
# the chunked program computes what the reference does, two steps, and read back from its file
if "$SPMD" run "$T/m.yaml" --check --steps 2 >"$T/run" 2>&1; then ok; else bad "run --check: $(grep -v ' ok$' "$T/run" | head -5)"; fi
if "$SPMD" run "$T/prog.yaml" >"$T/run" 2>&1; then ok; else bad "the written program runs: $(tail -3 "$T/run")"; fi

# 2. On TPU v4s the same model's collectives are short: nothing is cut, and the report says why.
model tpu-v4
"$SPMD" partition "$T/m.yaml" --json -o "$T/prog.yaml" >"$T/p.json" 2>"$T/err" || bad "tpu: $(cat "$T/err")"
py "tpu-v4: left alone, said why" \
	"not j['chunks']['chunked'] and j['chunks']['reason'].startswith('none: ')" \
	"not any('chunks, which' in (o.get('why') or '') for o in prog['ops'])"

# 3. The thread backend's profile: nothing overlaps there, the pass does not run.
model "$SRC/tests/window/threads.yaml"
"$SPMD" partition "$T/m.yaml" --json >"$T/p.json" 2>"$T/err" || bad "threads: $(cat "$T/err")"
py "threads profile: not looked at" "'chunks' not in j"

# 4. MPI: one rank per device computes what the threads do (tests/mpi_lib.sh).
if [ -z "$SPMD_SANITIZED" ] && command -v mpirun >/dev/null 2>&1; then
	. "$SRC/tests/mpi_lib.sh"
	model "$PROFILE"
	mkdir -p "$T/mpi"
	mpi_matches "$T/m.yaml" data=8,model=1 8 2 "$T/mpi" && ok || bad "mpi: $(tail -5 "$T/mpi/out")"
fi

echo "chunk_test: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
